package dsync_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/internal/redistest"
)

// braceNames contain or begin with a brace, or look like the encoding of
// another name ("=fXg" is how "}x" is stored). A name beginning with '}'
// once gave its keys an empty hash tag: on Redis Cluster they hashed to
// different slots and every script failed with CROSSSLOT.
var braceNames = []string{"}x", "{", "}", "{}", "a{b}c", "{x}", "}}{{", "=fXg", "fXg"}

// TestBraceNamesWork runs every primitive under names with braces, on
// miniredis, a real server and the cluster. The names are used as they are,
// under a prefix of the test's own.
func TestBraceNamesWork(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		prefix := dsync.Prefix(redistest.Key(t))
		for _, name := range braceNames {
			t.Run(name, func(t *testing.T) {
				ctx := ctxT(t)
				c1, c2 := newClient(t, b, prefix), newClient(t, b, prefix)
				braceMutex(ctx, t, c1.Mutex(name), c2.Mutex(name))
				braceRWMutex(ctx, t, c1.RWMutex(name), c2.RWMutex(name))
				braceSemaphore(ctx, t, c1.Semaphore(name, 2), c2.Semaphore(name, 2))
				braceOnce(ctx, t, c1.Once(name), c2.Once(name))
			})
		}
	})
}

// braceHold: h1 takes the name and has a fencing token, h2 is refused,
// then waits and is woken by h1's release.
func braceHold(ctx context.Context, t *testing.T, what string, h1, h2 holdCalls) {
	t.Helper()
	if err := h1.lock(ctx); err != nil {
		t.Fatalf("%s lock: %v", what, err)
	}
	if l, err := h1.lease(ctx); err != nil || l.Token() == 0 {
		t.Fatalf("%s Lease = %v, %v; want a fencing token", what, l, err)
	}
	if ok, err := h2.try(ctx); ok || err != nil {
		t.Fatalf("%s try while held = %v, %v; want false, nil", what, ok, err)
	}
	got := make(chan error, 1)
	go func() { got <- h2.lock(ctx) }()
	if err := h1.unlock(ctx); err != nil {
		t.Fatalf("%s unlock: %v", what, err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiting %s lock: %v", what, err)
	}
	if err := h2.unlock(ctx); err != nil {
		t.Fatalf("%s unlock: %v", what, err)
	}
}

// braceMutex: braceHold on two Mutex handles.
func braceMutex(ctx context.Context, t *testing.T, m1, m2 *dsync.Mutex) {
	t.Helper()
	braceHold(ctx, t, "Mutex", holdCalls{m1.Lock, m1.TryLock, m1.Unlock, m1.Lease}, holdCalls{m2.Lock, m2.TryLock, m2.Unlock, m2.Lease})
}

// braceSemaphore: braceHold on two handles of a Semaphore of 2 permits: s1
// takes both, s2 asks for one.
func braceSemaphore(ctx context.Context, t *testing.T, s1, s2 *dsync.Semaphore) {
	t.Helper()
	braceHold(ctx, t, "Semaphore", semCalls(s1, 2), semCalls(s2, 1))
}

// braceRWMutex: two readers share it and keep a writer out; a writer then
// waits for the last reader.
func braceRWMutex(ctx context.Context, t *testing.T, rw1, rw2 *dsync.RWMutex) {
	t.Helper()
	if err := rw1.RLock(ctx); err != nil {
		t.Fatalf("RLock: %v", err)
	}
	if err := rw2.RLock(ctx); err != nil {
		t.Fatalf("second RLock: %v", err)
	}
	if ok, err := rw2.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock while read = %v, %v; want false, nil", ok, err)
	}
	if err := rw2.RUnlock(ctx); err != nil {
		t.Fatalf("RUnlock: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- rw2.Lock(ctx) }()
	if err := rw1.RUnlock(ctx); err != nil {
		t.Fatalf("RUnlock: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiting Lock: %v", err)
	}
	if err := rw2.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
}

// braceOnce: f runs once across both handles.
func braceOnce(ctx context.Context, t *testing.T, o1, o2 *dsync.Once) {
	t.Helper()
	var runs atomic.Int64
	f := func(context.Context) error { runs.Add(1); return nil }
	for _, o := range []*dsync.Once{o1, o2, o1} {
		if err := o.Do(ctx, f); err != nil {
			t.Fatalf("Do: %v", err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("f ran %d times, want 1", n)
	}
}

// TestBraceNamesAreDistinct holds the Mutex of every brace name at once:
// no two of them share a key, also where one name's text is another's
// stored form.
func TestBraceNamesAreDistinct(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		p := redistest.Key(t)
		c := newClient(t, b, dsync.Prefix(p))
		var held []*dsync.Mutex
		for _, name := range braceNames {
			m := c.Mutex(name)
			if ok, err := m.TryLock(ctx); !ok || err != nil {
				t.Errorf("TryLock(%q) = %v, %v; want true, nil", name, ok, err)
				continue
			}
			held = append(held, m)
		}
		defer func() {
			for _, m := range held {
				if err := m.Unlock(ctx); err != nil {
					t.Errorf("Unlock: %v", err)
				}
			}
		}()
		rdb := b.NewClient(t)
		for _, name := range braceNames {
			k := keys.ForMutex(p, name)
			if n, err := rdb.Exists(ctx, k.Lock).Result(); n != 1 || err != nil {
				t.Errorf("%q: lock hash %q exists = %d, %v; want 1", name, k.Lock, n, err)
			}
		}
	})
}

// More names that a hash tag could split or that look like a key's
// suffix: every primitive works under each, on every deployment.
func TestMoreOddNamesWork(t *testing.T) {
	names := []string{"{x", "x{", "{{", "{}{}", "{\n}", "a}:f", "a}:rw:f", "}:f", "{a}:x", "=}", "a\x00}", "@{}",
		strings.Repeat("{", 300) + "}"}
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		prefix := dsync.Prefix(redistest.Key(t))
		for i, name := range names {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				c1, c2 := newClient(t, b, prefix), newClient(t, b, prefix)
				braceMutex(ctx, t, c1.Mutex(name), c2.Mutex(name))
				braceRWMutex(ctx, t, c1.RWMutex(name), c2.RWMutex(name))
				braceSemaphore(ctx, t, c1.Semaphore(name, 2), c2.Semaphore(name, 2))
				braceOnce(ctx, t, c1.Once(name), c2.Once(name))
			})
		}
	})
}
