package keys_test

import (
	"slices"
	"testing"

	"github.com/dsync-go/dsync/internal/keys"
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
		{"dsync:{orders:42}", "dsync:{orders:42}:f", "dsync:{orders:42}:q", "dsync:{orders:42}:qd"},
		{"dsync:{orders:42}:rw", "dsync:{orders:42}:rw:f", "dsync:{orders:42}:rw:r", "dsync:{orders:42}:rw:rc",
			"dsync:{orders:42}:rw:ww", "dsync:{orders:42}:rw:rq", "dsync:{orders:42}:rw:x", "dsync:{orders:42}:rw:wq",
			"dsync:{orders:42}:rw:wd"},
		{"dsync:{orders:42}:s", "dsync:{orders:42}:f", "dsync:{orders:42}:sh", "dsync:{orders:42}:sq", "dsync:{orders:42}:sqd"},
		{"dsync:{orders:42}:once", "dsync:{orders:42}:once:done"},
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
