package lua_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/dsync-go/dsync/lua"
)

// header returns the leading comment block of lua/<name>.lua.
func header(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name + ".lua")
	if err != nil {
		t.Fatal(err)
	}
	var h []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "--") {
			break
		}
		h = append(h, l)
	}
	return strings.Join(h, "\n")
}

// Every script file begins with its own header: what it does, its KEYS,
// its ARGV and its reply.
func TestEveryScriptHasItsOwnHeader(t *testing.T) {
	names := lua.Names()
	if len(names) < 13 {
		t.Fatalf("Names() = %v, want every script", names)
	}
	for _, n := range names {
		h := header(t, n)
		if !strings.HasPrefix(h, "-- "+n+": ") {
			t.Errorf("%s: the header does not begin with %q", n, "-- "+n+": ")
		}
		for _, want := range []string{"KEYS[", "ARGV[", "Reply: "} {
			if !strings.Contains(h, want) {
				t.Errorf("%s: the header says nothing of %q", n, want)
			}
		}
	}
}

// Server time is read in one place, lib.lua's clock, which every script
// begins with; the libraries read no KEYS or ARGV and change nothing at
// load.
func TestTimeIsReadInOnePlace(t *testing.T) {
	files, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	timeRE := regexp.MustCompile(`redis\.call\(\s*'TIME'`)
	var readers []string
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), ".lua") {
			continue
		}
		b, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		if n := len(timeRE.FindAll(b, -1)); n > 0 {
			readers = append(readers, f.Name())
		}
	}
	if len(readers) != 1 || readers[0] != "lib.lua" {
		t.Errorf("TIME read in %v, want only lib.lua", readers)
	}
	for _, n := range lua.Names() {
		if !strings.HasPrefix(lua.Source(n), header(t, "lib")) {
			t.Errorf("%s does not begin with lib.lua", n)
		}
	}
}

func TestACopyIsFresh(t *testing.T) {
	if lua.Script("mutex_lock") == lua.Script("mutex_lock") {
		t.Error("Script returned the same value twice: callers could change dsync's scripts")
	}
}

// A script gets the definitions of lib.lua that it uses, and only those:
// each one it names (outside whole comment lines) is in its source, and
// lib.lua's definitions that no script uses are left out of it.
func TestScriptsGetTheLibraryDefinitionsTheyUse(t *testing.T) {
	b, err := os.ReadFile("lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	defRE := regexp.MustCompile(`(?m)^local\s+(?:function\s+)?([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)`)
	var names []string
	for _, m := range defRE.FindAllStringSubmatch(string(b), -1) {
		names = append(names, strings.Split(strings.ReplaceAll(m[1], " ", ""), ",")...)
	}
	if len(names) < 10 {
		t.Fatalf("lib.lua defines %v, want its definitions", names)
	}
	trimmed := 0
	for _, n := range lua.Names() {
		src := lua.Source(n)
		defined := map[string]bool{}
		for _, m := range defRE.FindAllStringSubmatch(src, -1) {
			for _, d := range strings.Split(strings.ReplaceAll(m[1], " ", ""), ",") {
				defined[d] = true
			}
		}
		var code strings.Builder
		for _, l := range strings.Split(src, "\n") {
			if !strings.HasPrefix(strings.TrimSpace(l), "--") && !defRE.MatchString(l) {
				code.WriteString(l + "\n")
			}
		}
		for _, d := range names {
			named := regexp.MustCompile(`\b` + d + `\b`).MatchString(code.String())
			if named && !defined[d] {
				t.Errorf("%s uses %s but its source does not define it", n, d)
			}
			if !defined[d] {
				trimmed++
			}
		}
	}
	if trimmed == 0 {
		t.Error("every script gets every definition of lib.lua, used or not")
	}
}
