// Package lua holds dsync's Redis scripts. Every state change of a primitive
// is one of these scripts, named <primitive>_<op>.lua; each file's header
// lists its KEYS, ARGV and reply. The package hands out copies: nothing a
// caller does to them changes the scripts dsync runs.
package lua

import (
	"embed"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua
var files embed.FS

// Source returns the source of the script called name (its file name
// without ".lua"), as dsync runs it: the semaphore's acquire, release and
// abandon scripts begin with the shared definitions of semaphore_lib.lua. It
// panics if there is no such script, a programming error.
func Source(name string) string {
	b, err := files.ReadFile(name + ".lua")
	if err != nil {
		panic(fmt.Sprintf("lua: no script %q", name))
	}
	switch name {
	case "semaphore_acquire", "semaphore_release", "semaphore_abandon":
		return Source("semaphore_lib") + string(b)
	}
	return string(b)
}

// Script returns a new go-redis Script running Source(name).
func Script(name string) *redis.Script { return redis.NewScript(Source(name)) }

// Names returns the names of the scripts, without the shared library files.
func Names() []string {
	entries, _ := files.ReadDir(".")
	var names []string
	for _, e := range entries {
		n := strings.TrimSuffix(e.Name(), ".lua")
		if !strings.HasSuffix(n, "_lib") {
			names = append(names, n)
		}
	}
	return names
}
