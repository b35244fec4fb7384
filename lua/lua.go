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

	"github.com/dsync-go/dsync/internal/luasrc"
)

//go:embed *.lua
var files embed.FS

// libs names the scripts that begin with the shared definitions of a
// *_lib.lua file (after lib.lua's).
var libs = map[string]string{
	"semaphore_acquire": "semaphore_lib",
	"semaphore_release": "semaphore_lib",
	"semaphore_abandon": "semaphore_lib",
	"rwmutex_lock":      "rwmutex_lib",
	"rwmutex_unlock":    "rwmutex_lib",
	"mutex_lock":        "mutex_lib",
	"mutex_unlock":      "mutex_lib",
	"once_do":           "once_lib",
	"once_release":      "once_lib",
	"once_reset":        "once_lib",
}

// Source returns the source of the script called name (its file name
// without ".lua"), as dsync runs it: every script begins with lib.lua, and
// some with the shared definitions of their primitive's *_lib.lua too. It
// panics if there is no such script, a programming error.
//
// Of lib.lua, a script gets only the definitions it uses (directly or
// through another): Redis runs a script's top level on every call, so each
// definition costs every call the closure or table it makes.
func Source(name string) string {
	if strings.HasSuffix(name, "_lib") || name == "lib" {
		panic(fmt.Sprintf("lua: %q is a library, not a script", name))
	}
	rest := file(name)
	if lib, ok := libs[name]; ok {
		rest = file(lib) + rest
	}
	return luasrc.Join(file("lib"), rest)
}

// file returns the contents of lua/<name>.lua.
func file(name string) string {
	b, err := files.ReadFile(name + ".lua")
	if err != nil {
		panic(fmt.Sprintf("lua: no script %q", name))
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
		if !strings.HasSuffix(n, "_lib") && n != "lib" {
			names = append(names, n)
		}
	}
	return names
}
