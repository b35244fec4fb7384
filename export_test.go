package dsync

import (
	"fmt"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/lua"
)

// ScriptSource returns the source of the script called name (the file
// name in lua/ without .lua), as the package runs it: semaphore scripts
// begin with semaphore_lib.lua.
func ScriptSource(name string) (string, error) {
	src, err := os.ReadFile("lua/" + name + ".lua")
	if err != nil {
		return "", err
	}
	switch name {
	case "semaphore_acquire", "semaphore_release", "semaphore_abandon":
		lib, err := os.ReadFile("lua/semaphore_lib.lua")
		if err != nil {
			return "", err
		}
		return string(lib) + string(src), nil
	}
	return string(src), nil
}

// SwapScript makes the package run src in place of the script called name
// until restore is called. It is for tests that seed bugs (mutation_test.go)
// and must not run while other tests use the scripts.
func SwapScript(name, src string) (restore func()) {
	s := redis.NewScript(src)
	// Scripts the package runs through a *script wrapper.
	var w **script
	switch name {
	case "mutex_lock":
		w = &mutexLock
	case "mutex_unlock":
		w = &mutexUnlock
	case "semaphore_acquire":
		w = &semAcquire
	case "semaphore_release":
		w = &semRelease
	}
	if w != nil {
		old := *w
		*w = newScript(s)
		return func() { *w = old }
	}
	var p **redis.Script
	switch name {
	case "rwmutex_lock":
		p = &lua.RWMutexLock
	case "rwmutex_unlock":
		p = &lua.RWMutexUnlock
	case "once_do":
		p = &lua.OnceDo
	case "once_release":
		p = &lua.OnceRelease
	default:
		panic(fmt.Sprintf("SwapScript: unknown script %q", name))
	}
	old := *p
	*p = s
	return func() { *p = old }
}
