// Package lua holds dsync's Redis scripts. Every state change of a primitive
// is one of these scripts, named <primitive>_<op>.lua; each file's header
// lists its KEYS, ARGV and reply. The package hands out copies: nothing a
// caller does to them changes the scripts dsync runs.
package lua

import (
	"embed"
	"fmt"
	"regexp"
	"strings"

	"github.com/redis/go-redis/v9"
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
	return used(file("lib"), rest) + rest
}

// A definition of lib.lua: a top-level statement that begins "local" at
// the start of a line, with the comment paragraphs above it.
type definition struct {
	text  string
	names []string // the locals it defines
}

var (
	localRE = regexp.MustCompile(`^local\s+(?:function\s+)?([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)`)
	nameRE  = regexp.MustCompile(`[A-Za-z_]\w*`)
)

// used returns lib (definitions only, see lib.lua) without the definitions
// that neither code nor the definitions kept refer to. A name counts as
// referred to wherever it appears outside whole comment lines, strings
// included, so that a definition is dropped only when nothing can reach
// it. The header (the leading comment, up to the first blank line) is
// kept.
func used(lib, code string) string {
	lines := strings.SplitAfter(lib, "\n")
	n := 0
	for n < len(lines) && strings.TrimSpace(lines[n]) != "" {
		n++
	}
	head := strings.Join(lines[:min(n+1, len(lines))], "")
	var defs []definition
	var cur strings.Builder
	var names []string
	for _, l := range lines[min(n+1, len(lines)):] {
		m := localRE.FindStringSubmatch(l)
		if m == nil && l != "" && !strings.HasPrefix(l, "--") && !strings.HasPrefix(l, " ") &&
			strings.TrimSpace(l) != "" && !strings.HasPrefix(l, "end") && !strings.HasPrefix(l, "}") {
			// Dropping a definition would drop this statement with it.
			panic(fmt.Sprintf("lua: lib.lua runs %q at its top level: it holds definitions only", strings.TrimSpace(l)))
		}
		// A statement ends where a comment or statement at the start of a
		// line follows it (a function's body is indented, its end is not).
		if names != nil && (m != nil || strings.HasPrefix(l, "--")) {
			defs = append(defs, definition{cur.String(), names})
			cur.Reset()
			names = nil
		}
		if m != nil {
			names = strings.Split(strings.ReplaceAll(m[1], " ", ""), ",")
		}
		cur.WriteString(l)
	}
	if names != nil {
		defs = append(defs, definition{cur.String(), names})
	}

	need := map[string]bool{}
	refer := func(text string) {
		for _, l := range strings.SplitAfter(text, "\n") {
			if !strings.HasPrefix(strings.TrimSpace(l), "--") {
				for _, n := range nameRE.FindAllString(l, -1) {
					need[n] = true
				}
			}
		}
	}
	refer(code)
	keep := make([]bool, len(defs))
	for grew := true; grew; {
		grew = false
		for i, d := range defs {
			if keep[i] {
				continue
			}
			for _, n := range d.names {
				if need[n] {
					keep[i], grew = true, true
					// Its own definition line names it too: harmless.
					refer(d.text)
					break
				}
			}
		}
	}
	out := head
	for i, d := range defs {
		if keep[i] {
			out += d.text
		}
	}
	return out
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
