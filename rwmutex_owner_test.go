package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// RWMutex owners: re-entry, tokens across processes, downgrade and upgrade,
// client reentrancy.

// assertNextWriter checks that other's TryLock (for the owner of ctx) now
// takes the name, with a fencing token above fence, and that once it
// unlocks the name is left free.
func assertNextWriter(t *testing.T, ctx context.Context, b redistest.Backend, other *dsync.RWMutex, name string, fence uint64, after string) {
	t.Helper()
	if ok, err := other.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock %s = %v, %v", after, ok, err)
	}
	l, err := other.Lease(ctx)
	must(t, err)
	if l.Token() <= fence {
		t.Errorf("next fencing token %d, want > %d", l.Token(), fence)
	}
	must(t, other.Unlock(ctx))
	assertRWReleased(t, b, name)
}

func TestRWMutexReentrantOwner(t *testing.T) {
	eachOwnerName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rw := newClient(t, b).RWMutex(name)
		other := newClient(t, b).RWMutex(name)
		octx := dsync.WithOwner(context.Background())
		rdb := b.NewClient(t)
		tok := dsync.OwnerToken(ctx)

		// Read, three levels.
		for i := 0; i < 3; i++ {
			if err := rw.RLock(ctx); err != nil {
				t.Fatalf("RLock %d: %v", i, err)
			}
		}
		if v, _ := rdb.HGet(ctx, rwk(name).ReaderData, tok).Result(); !strings.HasPrefix(v, "3 ") {
			t.Errorf("read count in Redis = %q, want 3", v)
		}
		mustIs(t, other.RUnlock(octx), dsync.ErrNotHeld, "RUnlock by another owner = %v, want ErrNotHeld")
		unlockLevels(t, 3, gotIn(t, octx, other.TryLock, other.Unlock), func() error { return rw.RUnlock(ctx) }, "RUnlock")
		mustIs(t, rw.RUnlock(ctx), dsync.ErrNotHeld, "fourth RUnlock = %v, want ErrNotHeld")

		// Write, three levels, with one fencing token.
		var fence uint64
		for i := 0; i < 3; i++ {
			if err := rw.Lock(ctx); err != nil {
				t.Fatalf("Lock %d: %v", i, err)
			}
			l, err := rw.Lease(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				fence = l.Token()
			} else if l.Token() != fence {
				t.Errorf("re-entry %d changed the fencing token: %d, want %d", i, l.Token(), fence)
			}
		}
		mustIs(t, other.Unlock(octx), dsync.ErrNotHeld, "Unlock by another owner = %v, want ErrNotHeld")
		mustIs(t, rw.Unlock(context.Background()), dsync.ErrNotHeld, "Unlock without owner = %v, want ErrNotHeld")
		unlockLevels(t, 3, gotIn(t, octx, other.TryRLock, other.RUnlock), func() error { return rw.Unlock(ctx) }, "Unlock")
		assertNextWriter(t, octx, b, other, name, fence, "after the last Unlock")
	})
}

func TestRWMutexOwnerAcrossProcesses(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		name := redistest.Key(t)
		a := newClient(t, b).RWMutex(name)
		bm := newClient(t, b).RWMutex(name)
		ctxA := dsync.WithOwner(ctxT(t))
		ctxB := dsync.WithOwnerToken(ctxT(t), dsync.OwnerToken(ctxA))
		must(t, a.RLock(ctxA))
		if ok, err := bm.TryRLock(ctxB); !ok || err != nil {
			t.Fatalf("read re-entry from another process = %v, %v", ok, err)
		}
		must(t, bm.RUnlock(ctxB))
		// The first process's share is still held and renewed.
		if ok, _ := newClient(t, b).RWMutex(name).TryLock(context.Background()); ok {
			t.Fatal("write lock free while the owner still reads")
		}
		must(t, a.RUnlock(ctxA))
		assertRWReleased(t, b, name)
	})
}

func TestRWMutexDowngrade(t *testing.T) {
	eachOwnerName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rw := newClient(t, b).RWMutex(name)
		other := newClient(t, b).RWMutex(name)
		must(t, rw.Lock(ctx))
		// A reader waits for the writer.
		got := make(chan error, 1)
		go func() { got <- other.RLock(ctxT(t)) }()
		waitFor(t, 5*time.Second, "the reader to wait", func() bool {
			n, _ := b.NewClient(t).Exists(context.Background(), rwk(name).WaitingReaders).Result()
			return n == 1
		})
		if err := rw.RLock(ctx); err != nil {
			t.Fatalf("RLock by the writer (downgrade) = %v", err)
		}
		if err := rw.Lock(ctx); err != nil {
			t.Fatalf("Lock while writing and reading = %v, want a re-entry", err)
		}
		must(t, rw.Unlock(ctx))
		select {
		case err := <-got:
			t.Fatalf("reader got in while the writer re-entered: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		must(t, rw.Unlock(ctx))
		// The writer still reads; the waiting reader shares with it.
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("waiting reader: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("waiting reader not admitted after the downgrade")
		}
		if _, err := rw.Lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
			t.Errorf("Lease after Unlock = %v, want ErrNotHeld", err)
		}
		if l, err := rw.RLease(ctx); err != nil || l.Err() != nil {
			t.Fatalf("RLease after the downgrade = %v, %v; want live", l, err)
		}
		octx := dsync.WithOwner(context.Background())
		w := newClient(t, b).RWMutex(name)
		if ok, _ := w.TryLock(octx); ok {
			t.Fatal("write lock free while the downgraded owner reads")
		}
		must(t, other.RUnlock(context.Background()))
		must(t, rw.RUnlock(ctx))
		if ok, err := w.TryLock(octx); !ok || err != nil {
			t.Fatalf("TryLock after the readers left = %v, %v", ok, err)
		}
		must(t, w.Unlock(octx))
	})
}

func TestRWMutexUpgradeRefused(t *testing.T) {
	eachOwnerName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rw := newClient(t, b).RWMutex(name)
		must(t, rw.RLock(ctx))
		start := time.Now()
		mustIs(t, rw.Lock(ctx), dsync.ErrUpgrade, "Lock while reading = %v, want ErrUpgrade")
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("ErrUpgrade took %v, want at once", d)
		}
		if ok, err := rw.TryLock(ctx); ok || !errors.Is(err, dsync.ErrUpgrade) {
			t.Fatalf("TryLock while reading = %v, %v; want false, ErrUpgrade", ok, err)
		}
		// Another owner reading does not make it an upgrade, and the refused
		// Lock left no waiting place that would block readers.
		if ok, err := newClient(t, b).RWMutex(name).TryRLock(context.Background()); !ok || err != nil {
			t.Fatalf("TryRLock after the refused upgrade = %v, %v; want true", ok, err)
		}
		must(t, rw.RUnlock(ctx))
		// Another process of the same owner reads: still an upgrade.
		other := newClient(t, b).RWMutex(name)
		must(t, other.RLock(ctx))
		mustIs(t, rw.Lock(ctx), dsync.ErrUpgrade, "Lock while the owner reads elsewhere = %v, want ErrUpgrade")
		must(t, other.RUnlock(ctx))
	})
}

// TestRWMutexClientReentrancy runs one history of an owner in both
// reentrancy modes (reentrancyModes, index 0 script, 1 client): the outcomes
// are the same, and with client reentrancy a re-entry or an inner unlock of
// either mode costs no round trip.
func TestRWMutexClientReentrancy(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for mi, mode := range reentrancyModes {
			t.Run(mode.name, func(t *testing.T) {
				ctx := dsync.WithOwner(ctxT(t))
				name := redistest.Key(t)
				counter := &redistest.Counter{}
				c, _ := hookedClient(t, b, counter, mode.opts...)
				rw := c.RWMutex(name)
				other := newClient(t, b).RWMutex(name)
				octx := dsync.WithOwner(context.Background())
				check := b.NewClient(t)
				tok := dsync.OwnerToken(ctx)
				// Load the scripts where the name lives.
				for _, f := range []func(context.Context) error{rw.RLock, rw.RUnlock, rw.Lock, rw.Unlock} {
					must(t, f(ctx))
				}

				// step runs one call of the owner and checks its error and
				// its round trips: rt[0] with script reentrancy, rt[1] with
				// client reentrancy.
				step := func(what string, rt [2]int64, want error, call func() error) {
					t.Helper()
					counter.Reset()
					if err := call(); !errors.Is(err, want) || (want == nil && err != nil) {
						t.Fatalf("%s = %v, want %v", what, err, want)
					}
					if got := counter.RoundTrips(); got != rt[mi] {
						t.Errorf("%s took %d round trips, want %d", what, got, rt[mi])
					}
				}
				try := func(f func(context.Context) (bool, error), want bool) func() error {
					return func() error {
						ok, err := f(ctx)
						if err == nil && ok != want {
							return fmt.Errorf("got %v, want %v", ok, want)
						}
						return err
					}
				}
				otherGetsIn := func() bool {
					ok, err := other.TryLock(octx)
					if err != nil {
						t.Fatal(err)
					}
					if ok {
						must(t, other.Unlock(octx))
					}
					return ok
				}
				redisCount := func(key, field string) string {
					n, _, _ := strings.Cut(holderField(t, check, key, field), " ")
					return n
				}
				wantCount := []string{"3", "1"}[mi]

				// Read: three levels, one of them by TryRLock.
				step("first RLock", [2]int64{1, 1}, nil, func() error { return rw.RLock(ctx) })
				step("RLock re-entry", [2]int64{1, 0}, nil, func() error { return rw.RLock(ctx) })
				step("TryRLock re-entry", [2]int64{1, 0}, nil, try(rw.TryRLock, true))
				if got := redisCount(rwk(name).ReaderData, tok); got != wantCount {
					t.Errorf("read count in Redis = %q, want %s", got, wantCount)
				}
				for i := 0; i < 2; i++ {
					step("inner RUnlock", [2]int64{1, 0}, nil, func() error { return rw.RUnlock(ctx) })
					if otherGetsIn() {
						t.Fatalf("write lock free after %d of 3 RUnlocks", i+1)
					}
				}
				step("last RUnlock", [2]int64{1, 1}, nil, func() error { return rw.RUnlock(ctx) })
				step("extra RUnlock", [2]int64{1, 1}, dsync.ErrNotHeld, func() error { return rw.RUnlock(ctx) })
				if !otherGetsIn() {
					t.Fatal("write lock not free after the last RUnlock")
				}

				// Write: three levels with one fencing token.
				step("first Lock", [2]int64{1, 1}, nil, func() error { return rw.Lock(ctx) })
				l, err := rw.Lease(ctx)
				if err != nil {
					t.Fatal(err)
				}
				fence := l.Token()
				step("Lock re-entry", [2]int64{1, 0}, nil, func() error { return rw.Lock(ctx) })
				step("TryLock re-entry", [2]int64{1, 0}, nil, try(rw.TryLock, true))
				if l, err := rw.Lease(ctx); err != nil || l.Token() != fence {
					t.Fatalf("Lease after re-entries = %v, %v; want token %d", l, err, fence)
				}
				if got := redisCount(rwk(name).Writer, tok); got != wantCount {
					t.Errorf("write count in Redis = %q, want %s", got, wantCount)
				}
				step("inner Unlock", [2]int64{1, 0}, nil, func() error { return rw.Unlock(ctx) })
				step("inner Unlock", [2]int64{1, 0}, nil, func() error { return rw.Unlock(ctx) })
				if ok, _ := other.TryRLock(octx); ok {
					t.Fatal("read lock free while one write level is held")
				}

				// Downgrade: the writer reads, then lets go of the write lock.
				step("RLock by the writer", [2]int64{1, 1}, nil, func() error { return rw.RLock(ctx) })
				step("RLock re-entry by the writer", [2]int64{1, 0}, nil, func() error { return rw.RLock(ctx) })
				step("last Unlock", [2]int64{1, 1}, nil, func() error { return rw.Unlock(ctx) })
				if _, err := rw.Lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
					t.Errorf("Lease after the downgrade = %v, want ErrNotHeld", err)
				}
				if l, err := rw.RLease(ctx); err != nil || l.Err() != nil {
					t.Fatalf("RLease after the downgrade = %v, %v; want live", l, err)
				}
				if otherGetsIn() {
					t.Fatal("write lock free while the downgraded owner reads")
				}

				// Upgrade: refused at once, as with script reentrancy.
				step("Lock while reading", [2]int64{1, 1}, dsync.ErrUpgrade, func() error { return rw.Lock(ctx) })
				step("TryLock while reading", [2]int64{1, 1}, dsync.ErrUpgrade, try(rw.TryLock, false))
				step("inner RUnlock", [2]int64{1, 0}, nil, func() error { return rw.RUnlock(ctx) })
				step("last RUnlock", [2]int64{1, 1}, nil, func() error { return rw.RUnlock(ctx) })
				assertNextWriter(t, octx, b, other, name, fence, "after the owner left")
			})
		}
	})
}

// With client reentrancy an owner token carried to another process does
// not re-enter there, for writes nor reads: a write waits like any other
// owner's, and a read through it is a hold of its own, so that the first
// process's RUnlock leaves it in place and a writer stays out.
func TestRWMutexClientReentrancyCarriedToken(t *testing.T) {
	eachOwnerName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		one := dsync.New(b.NewClient(t), dsync.ClientReentrancy())
		defer one.Close()
		two := dsync.New(b.NewClient(t), dsync.ClientReentrancy())
		defer two.Close()
		octx := dsync.WithOwnerToken(ctxT(t), dsync.OwnerToken(ctx))
		rw1, rw2 := one.RWMutex(name), two.RWMutex(name)

		must(t, rw1.Lock(ctx))
		if ok, err := rw2.TryLock(octx); ok || err != nil {
			t.Fatalf("TryLock with the token carried to another process = %v, %v; want false", ok, err)
		}
		if ok, err := rw2.TryRLock(octx); ok || err != nil {
			t.Fatalf("TryRLock with the token carried to another process while the first writes = %v, %v; want false", ok, err)
		}
		must(t, rw1.Unlock(ctx))

		must(t, rw1.RLock(ctx))
		must(t, rw2.RLock(octx))
		must(t, rw1.RUnlock(ctx))
		w := newClient(t, b).RWMutex(name)
		wctx := dsync.WithOwner(ctxT(t))
		if ok, err := w.TryLock(wctx); ok || err != nil {
			t.Fatalf("another owner's TryLock while the carried token reads = %v, %v; want false", ok, err)
		}
		must(t, rw2.RUnlock(octx))
		if ok, err := w.TryLock(wctx); !ok || err != nil {
			t.Fatalf("another owner's TryLock once both read holds ended = %v, %v; want true", ok, err)
		}
		must(t, w.Unlock(wctx))
	})
}
