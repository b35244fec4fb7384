// Package luasrc puts a script's source together as dsync runs it: the
// shared definitions of lib.lua that the script uses, then the script. It
// is apart from package lua so that a benchmark can put another version
// of the scripts together the same way (see BenchmarkServerTime).
package luasrc

import (
	"fmt"
	"regexp"
	"strings"
)

// Join returns lib (the text of lib.lua: definitions only) without the
// definitions that rest does not use, directly or through another, then
// rest: Redis runs a script's top level on every call, so each definition
// costs every call the closure or table it makes. It panics if lib runs a
// statement at its top level, a programming error: dropping a definition
// would drop that statement with it.
func Join(lib, rest string) string {
	return used(lib, rest) + rest
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
			panic(fmt.Sprintf("luasrc: lib.lua runs %q at its top level: it holds definitions only", strings.TrimSpace(l)))
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
