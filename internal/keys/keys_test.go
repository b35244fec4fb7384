package keys_test

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/lua"
)

// all returns every key of every primitive of name under prefix.
func all(prefix, name string) [][]string {
	return [][]string{
		keys.ForMutex(prefix, name).Keys(),
		keys.ForRWMutex(prefix, name).Keys(),
		keys.ForSemaphore(prefix, name).Keys(),
		keys.ForOnce(prefix, name).Keys(),
	}
}

// TestKeyNamesAreStable pins the stored key names: a change moves every
// hold to other keys, so that versions of dsync no longer see each other's.
func TestKeyNamesAreStable(t *testing.T) {
	got := all("dsync", "orders:42")
	want := [][]string{
		{"dsync:{orders:42}", "dsync:{orders:42}:f", "dsync:{orders:42}:q", "dsync:{orders:42}:qd", "dsync:{orders:42}:x"},
		{"dsync:{orders:42}:rw", "dsync:{orders:42}:rw:f", "dsync:{orders:42}:rw:r", "dsync:{orders:42}:rw:rc",
			"dsync:{orders:42}:rw:ww", "dsync:{orders:42}:rw:rq", "dsync:{orders:42}:rw:x", "dsync:{orders:42}:rw:wq",
			"dsync:{orders:42}:rw:wd"},
		{"dsync:{orders:42}:s", "dsync:{orders:42}:f", "dsync:{orders:42}:sh", "dsync:{orders:42}:sq", "dsync:{orders:42}:sqd",
			"dsync:{orders:42}:sx"},
		{"dsync:{orders:42}:once", "dsync:{orders:42}:once:done", "dsync:{orders:42}:once:x"},
	}
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("keys = %q\nwant   %q", got[i], want[i])
		}
	}
	if got, want := keys.Base("dsync", "orders:42"), "dsync:{orders:42}"; got != want {
		t.Errorf("Base = %q, want %q", got, want)
	}
}

func TestKeyChannelsAreMainKeys(t *testing.T) {
	const p, n = "dsync", "x"
	for _, c := range []struct{ channel, main string }{
		{keys.ForMutex(p, n).Channel(), keys.ForMutex(p, n).Lock},
		{keys.ForRWMutex(p, n).Channel(), keys.ForRWMutex(p, n).Writer},
		{keys.ForSemaphore(p, n).Channel(), keys.ForSemaphore(p, n).State},
		{keys.ForOnce(p, n).Channel(), keys.ForOnce(p, n).Run},
	} {
		if c.channel != c.main {
			t.Errorf("channel %q, want the main key %q", c.channel, c.main)
		}
	}
}

// TestKeyFenceSharedByMutexAndSemaphore: one name has one fencing sequence
// for its Mutex and Semaphore; the RWMutex has its own.
func TestKeyFenceSharedByMutexAndSemaphore(t *testing.T) {
	m, s, rw := keys.ForMutex("dsync", "x"), keys.ForSemaphore("dsync", "x"), keys.ForRWMutex("dsync", "x")
	if m.Fence != s.Fence {
		t.Errorf("Mutex fence %q, Semaphore fence %q; want one", m.Fence, s.Fence)
	}
	if rw.Fence == m.Fence {
		t.Errorf("RWMutex fence %q is the Mutex's", rw.Fence)
	}
}

// TestKeyDistinct: apart from the shared fence hash, no two keys of a name
// are the same.
func TestKeyDistinct(t *testing.T) {
	seen := map[string]bool{}
	fence := keys.ForMutex("dsync", "x").Fence
	for _, ks := range all("dsync", "x") {
		for _, k := range ks {
			if seen[k] && k != fence {
				t.Errorf("key %q used twice", k)
			}
			seen[k] = true
		}
	}
}

func TestKeyNameOfEveryKey(t *testing.T) {
	for _, prefix := range []string{"dsync", "app:locks", "p{x}", "*"} {
		for _, name := range []string{"x", "orders:42", "a}b", "{x", "a:f}:q", "日本"} {
			for _, ks := range all(prefix, name) {
				for _, k := range ks {
					got, ok := keys.Name(prefix, k)
					if !ok || got != name {
						t.Errorf("Name(%q, %q) = %q, %v; want %q", prefix, k, got, ok, name)
					}
				}
			}
		}
	}
	for _, k := range []string{"other:{x}", "dsync:x", "dsync:{x}:nope", "dsync:{x", "dsync:{x}:f:g"} {
		if n, ok := keys.Name("dsync", k); ok {
			t.Errorf("Name(dsync, %q) = %q, true; want false", k, n)
		}
	}
}

func TestKeyMatchEscapesPrefix(t *testing.T) {
	if got, want := keys.Match(`a*b?[c]\`, "x*"), `a\*b\?\[c\]\\:{x*}*`; got != want {
		t.Errorf("Match = %q, want %q", got, want)
	}
}

// trickyNames are names whose text could break a hash tag or look like
// another name's encoding.
var trickyNames = []string{
	"}", "}x", "}}", "}{", "{", "{}", "{x}", "{{", "a{b}c", "a}b", "a}", "x}:f",
	"=", "==", "=x", "=fXg", "fXg", "=fQ", "fQ", "x", ":f", ":rw", "\x00", "é}",
	"dsync:{x}", "*", "?", "[a]",
}

// hashTag returns what Redis Cluster hashes of key: the text between the
// first '{' and the first '}' after it when not empty, else the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// tb is what the checks need of a *testing.T or a *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

// checkOneSlot checks that every key of every primitive of name hashes by
// one hash tag, so that a script on them runs on Redis Cluster.
func checkOneSlot(t tb, prefix, name string) {
	t.Helper()
	for _, ks := range all(prefix, name) {
		tag := hashTag(ks[0])
		if tag == ks[0] {
			t.Fatalf("name %q: key %q has no hash tag", name, ks[0])
		}
		for _, k := range ks[1:] {
			if got := hashTag(k); got != tag {
				t.Fatalf("name %q: key %q hashes by %q, key %q by %q", name, ks[0], tag, k, got)
			}
		}
	}
}

// checkNames checks that Name gives back name from each of its keys.
func checkNames(t tb, prefix, name string) {
	t.Helper()
	for _, ks := range all(prefix, name) {
		for _, k := range ks {
			if got, ok := keys.Name(prefix, k); !ok || got != name {
				t.Fatalf("Name(%q, %q) = %q, %v; want %q", prefix, k, got, ok, name)
			}
		}
	}
}

// checkDisjoint checks that two different names share no key.
func checkDisjoint(t tb, prefix, a, b string) {
	t.Helper()
	if a == b {
		return
	}
	ka := map[string]bool{}
	for _, ks := range all(prefix, a) {
		for _, k := range ks {
			ka[k] = true
		}
	}
	for _, ks := range all(prefix, b) {
		for _, k := range ks {
			if ka[k] {
				t.Fatalf("names %q and %q share key %q", a, b, k)
			}
		}
	}
}

func TestKeyBraceNamesOneSlot(t *testing.T) {
	for _, name := range trickyNames {
		checkOneSlot(t, "dsync", name)
	}
	// The empty name is refused before any key is built; its keys would
	// still share a slot.
	checkOneSlot(t, "dsync", "")
}

func TestKeyBraceNamesRoundTrip(t *testing.T) {
	for _, prefix := range []string{"dsync", "a:b", "*"} {
		for _, name := range append(trickyNames, "") {
			checkNames(t, prefix, name)
		}
	}
}

func TestKeyBraceNamesInjective(t *testing.T) {
	for _, a := range append(trickyNames, "") {
		for _, b := range append(trickyNames, "") {
			checkDisjoint(t, "dsync", a, b)
		}
	}
}

// TestKeyBraceOrdinaryNamesUnchanged: only names that begin with '}' or '='
// (and the empty name) are encoded; any other name, braces included, keeps
// the keys of earlier versions.
func TestKeyBraceOrdinaryNamesUnchanged(t *testing.T) {
	for _, name := range trickyNames {
		got := keys.Base("dsync", name)
		encoded := name[0] == '}' || name[0] == '='
		if plain := "dsync:{" + name + "}"; (got == plain) == encoded {
			t.Errorf("Base(dsync, %q) = %q; encoded: %v", name, got, encoded)
		}
		if encoded && strings.ContainsAny(hashTag(got), "}") {
			t.Errorf("Base(dsync, %q) = %q: its tag holds a brace", name, got)
		}
	}
	if got, want := keys.Base("dsync", "}x"), "dsync:{=fXg}"; got != want {
		t.Errorf("Base(dsync, }x) = %q, want %q", got, want)
	}
}

// TestKeyBraceNameRejectsForeignKeys: keys that no name has are not
// taken for a name's, in particular an encoding that is not the one
// Base writes and the key an earlier version wrote for a name beginning
// with '}'.
func TestKeyBraceNameRejectsForeignKeys(t *testing.T) {
	for _, k := range []string{
		"dsync:{}x}",     // earlier versions' key of "}x"
		"dsync:{}",       // empty tag
		"dsync:{=YQ}",    // "a" encoded, but "a" is its own tag
		"dsync:{=fXh}",   // not the canonical encoding of "}x"
		"dsync:{=!!}:f",  // not base64url
		"dsync:{=fXg=}",  // padded
		"dsync:{=fXg}:z", // no such suffix
	} {
		if n, ok := keys.Name("dsync", k); ok {
			t.Errorf("Name(dsync, %q) = %q, true; want false", k, n)
		}
	}
}

// TestKeyBraceProperties checks the layout over random names made of the
// characters that matter.
func TestKeyBraceProperties(t *testing.T) {
	name := rapid.StringOfN(rapid.SampledFrom([]rune("{}=:fqx\x00é")), 0, 8, -1)
	rapid.Check(t, func(t *rapid.T) {
		a, b := name.Draw(t, "a"), name.Draw(t, "b")
		checkOneSlot(t, "dsync", a)
		checkNames(t, "dsync", a)
		checkDisjoint(t, "dsync", a, b)
		if a != "" && a[0] != '}' && a[0] != '=' && keys.Base("dsync", a) != "dsync:{"+a+"}" {
			t.Fatalf("Base(dsync, %q) = %q, want the name as tag", a, keys.Base("dsync", a))
		}
	})
}

// TestKeyBraceMatch: the SCAN pattern of a glob that may match an encoded
// name matches every key; one that cannot keeps the name in the pattern.
func TestKeyBraceMatch(t *testing.T) {
	for pattern, want := range map[string]string{
		"*":       "dsync:{*",
		"?x":      "dsync:{*",
		"[}a]*":   "dsync:{*",
		"}*":      "dsync:{*",
		"=*":      "dsync:{*",
		`\}x`:     "dsync:{*",
		"orders*": "dsync:{orders*}*",
		`\*x`:     `dsync:{\*x}*`,
		"{x}":     "dsync:{{x}}*",
	} {
		if got := keys.Match("dsync", pattern); got != want {
			t.Errorf("Match(dsync, %q) = %q, want %q", pattern, got, want)
		}
	}
}

// TestKeysCoverScripts: every key a script of a primitive reads or writes
// is in the layout, in the scripts' KEYS order: the highest KEYS[i] in each
// script that takes all the keys is the number of keys of its primitive.
func TestKeysCoverScripts(t *testing.T) {
	keysRE := regexp.MustCompile(`KEYS\[(\d+)\]`)
	for _, c := range []struct {
		scripts []string
		n       int
	}{
		{[]string{"mutex_lock", "mutex_unlock"}, len(keys.ForMutex("dsync", "x").Keys())},
		{[]string{"rwmutex_lock", "rwmutex_unlock"}, len(keys.ForRWMutex("dsync", "x").Keys())},
		{[]string{"semaphore_acquire", "semaphore_release", "semaphore_abandon"}, len(keys.ForSemaphore("dsync", "x").Keys())},
		{[]string{"once_do", "once_release"}, len(keys.ForOnce("dsync", "x").Keys())},
	} {
		for _, s := range c.scripts {
			most := 0
			for _, m := range keysRE.FindAllStringSubmatch(lua.Source(s), -1) {
				i, _ := strconv.Atoi(m[1])
				most = max(most, i)
			}
			if most != c.n {
				t.Errorf("%s uses KEYS[1..%d], the layout has %d keys", s, most, c.n)
			}
		}
	}
}
