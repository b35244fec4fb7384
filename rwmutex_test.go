package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/internal/redistest"
)

// rwk returns the keys of the RWMutex called name.
func rwk(name string) keys.RWMutex { return keys.ForRWMutex(dsync.DefaultPrefix, name) }

// assertRWReleased checks that a free RWMutex left only bookkeeping behind:
// see assertBookkeepingOnly.
func assertRWReleased(t *testing.T, b redistest.Backend, name string) {
	t.Helper()
	ks := rwk(name)
	assertBookkeepingOnly(t, b, ks.Keys(), ks.Fence, ks.Calls)
}

// waitFor polls cond every few ms for at most d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// writerWaits reports whether a writer has a waiting place on name.
func writerWaits(t *testing.T, rdb redis.UniversalClient, name string) func() bool {
	return func() bool {
		n, err := rdb.ZCard(context.Background(), rwk(name).WaitingWriters).Result()
		if err != nil {
			t.Error(err)
			return true
		}
		return n > 0
	}
}

func TestRWMutexReadersShareWriterExcludes(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		var readers []*dsync.RWMutex
		for i := 0; i < 4; i++ {
			rw := newClient(t, b).RWMutex(name)
			if ok, err := rw.TryRLock(ctx); !ok || err != nil {
				t.Fatalf("reader %d: TryRLock = %v, %v; want true, nil", i, ok, err)
			}
			readers = append(readers, rw)
		}
		w := newClient(t, b).RWMutex(name)
		for i, r := range readers {
			if ok, err := w.TryLock(ctx); ok || err != nil {
				t.Fatalf("TryLock with %d readers = %v, %v; want false, nil", len(readers)-i, ok, err)
			}
			if err := r.RUnlock(ctx); err != nil {
				t.Fatalf("RUnlock %d: %v", i, err)
			}
		}
		if ok, err := w.TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock after every RUnlock = %v, %v; want true, nil", ok, err)
		}
		// Without an owner a handle is not reentrant, like sync.RWMutex.
		if ok, err := w.TryLock(ctx); ok || err != nil {
			t.Fatalf("TryLock on the writing handle = %v, %v; want false, nil", ok, err)
		}
		if ok, err := readers[0].TryRLock(ctx); ok || err != nil {
			t.Fatalf("TryRLock while written = %v, %v; want false, nil", ok, err)
		}
		must(t, w.Unlock(ctx))
		assertRWReleased(t, b, name)
	})
}

func TestRWMutexHammer(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const clients, perClient, rounds = 3, 3, 25
		var readers, writers, maxReaders, reads, writes atomic.Int64
		var bad atomic.Int64
		hammerClients(t, b, clients, perClient, rounds, func(c *dsync.Client, j int) func() error {
			rw := c.RWMutex(name)
			var gctx context.Context = ctx
			if j == 0 {
				gctx = dsync.WithOwner(ctx)
			}
			return func() error {
				pause := time.Duration(rand.IntN(300)) * time.Microsecond
				if rand.IntN(4) == 0 {
					if err := rw.Lock(gctx); err != nil {
						return fmt.Errorf("Lock: %w", err)
					}
					if writers.Add(1) != 1 || readers.Load() != 0 {
						bad.Add(1)
					}
					writes.Add(1)
					time.Sleep(pause)
					writers.Add(-1)
					if err := rw.Unlock(gctx); err != nil {
						return fmt.Errorf("Unlock: %w", err)
					}
					return nil
				}
				if err := rw.RLock(gctx); err != nil {
					return fmt.Errorf("RLock: %w", err)
				}
				n := readers.Add(1)
				if writers.Load() != 0 {
					bad.Add(1)
				}
				for m := maxReaders.Load(); n > m && !maxReaders.CompareAndSwap(m, n); m = maxReaders.Load() {
				}
				reads.Add(1)
				time.Sleep(pause)
				readers.Add(-1)
				if err := rw.RUnlock(gctx); err != nil {
					return fmt.Errorf("RUnlock: %w", err)
				}
				return nil
			}
		})
		t.Logf("reads %d, writes %d, most readers at once %d", reads.Load(), writes.Load(), maxReaders.Load())
		if n := bad.Load(); n != 0 {
			t.Errorf("a writer held the lock together with someone else %d times", n)
		}
		if got, want := reads.Load()+writes.Load(), int64(clients*perClient*rounds); got != want {
			t.Errorf("acquisitions = %d, want %d", got, want)
		}
		assertRWReleased(t, b, name)
	})
}

func TestRWMutexOneHandleManyReaders(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rw := newClient(t, b).RWMutex(name)
		const G = 5
		inParallel(t, G, func() error { return rw.RLock(ctx) })
		if n, _ := b.NewClient(t).ZCard(ctx, rwk(name).Readers).Result(); n != G {
			t.Errorf("readers in Redis = %d, want %d", n, G)
		}
		// Any goroutine may release them, one per RUnlock.
		inParallel(t, G, func() error {
			if err := rw.RUnlock(context.Background()); err != nil {
				return fmt.Errorf("RUnlock: %w", err)
			}
			return nil
		})
		checkIs(t, rw.RUnlock(ctx), dsync.ErrNotHeld, "extra RUnlock = %v, want ErrNotHeld")
		assertRWReleased(t, b, name)
	})
}

func TestRWMutexNotHeld(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rw := newClient(t, b).RWMutex(name)
		octx := dsync.WithOwner(ctx)
		for _, c := range []context.Context{ctx, octx} {
			checkIs(t, rw.RUnlock(c), dsync.ErrNotHeld, "RUnlock of nothing = %v, want ErrNotHeld")
			checkIs(t, rw.Unlock(c), dsync.ErrNotHeld, "Unlock of nothing = %v, want ErrNotHeld")
			if _, err := rw.Lease(c); !errors.Is(err, dsync.ErrNotHeld) {
				t.Errorf("Lease of nothing = %v, want ErrNotHeld", err)
			}
			if _, err := rw.RLease(c); !errors.Is(err, dsync.ErrNotHeld) {
				t.Errorf("RLease of nothing = %v, want ErrNotHeld", err)
			}
		}
		// The modes do not stand in for each other.
		must(t, rw.Lock(octx))
		checkIs(t, rw.RUnlock(octx), dsync.ErrNotHeld, "RUnlock while only writing = %v, want ErrNotHeld")
		must(t, rw.Unlock(octx))
		must(t, rw.RLock(ctx))
		checkIs(t, rw.Unlock(ctx), dsync.ErrNotHeld, "Unlock while only reading = %v, want ErrNotHeld")
		// A reader whose share was deleted behind its back is told.
		must(t, b.NewClient(t).Del(ctx, rwk(name).Readers, rwk(name).ReaderData).Err())
		checkIs(t, rw.RUnlock(ctx), dsync.ErrLeaseLost, "RUnlock of a deleted share = %v, want ErrLeaseLost")
	})
}

func TestRWMutexLostUnlockReplyRetried(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		faults := &redistest.Faults{}
		c, _ := hookedClient(t, b, faults)
		rw := c.RWMutex(name)
		octx := dsync.WithOwner(ctx)
		for i := 0; i < 2; i++ {
			must(t, rw.RLock(octx))
		}
		// The first RUnlock runs on the server, its reply is lost; the
		// caller retries, which must not lower the count again.
		faults.DropReplyNext(1, context.DeadlineExceeded)
		mustIs(t, rw.RUnlock(octx), context.DeadlineExceeded, "RUnlock = %v, want the injected error")
		if err := rw.RUnlock(octx); err != nil {
			t.Fatalf("retried RUnlock = %v", err)
		}
		if ok, _ := newClient(t, b).RWMutex(name).TryLock(ctx); ok {
			t.Fatal("one RUnlock counted twice: write lock free while a read level is held")
		}
		// A full release whose reply is lost, retried: answers as before.
		faults.DropReplyNext(1, context.DeadlineExceeded)
		mustIs(t, rw.RUnlock(octx), context.DeadlineExceeded, "RUnlock = %v, want the injected error")
		if err := rw.RUnlock(octx); err != nil {
			t.Fatalf("retried last RUnlock = %v, want nil", err)
		}
		mustIs(t, rw.RUnlock(octx), dsync.ErrNotHeld, "RUnlock after release = %v, want ErrNotHeld")
	})
}

func TestRWMutexUncontendedRoundTrips(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		counter := &redistest.Counter{}
		c, _ := hookedClient(t, b, counter)
		rw := c.RWMutex(redistest.Key(t))
		// Load the scripts.
		must(t, rw.RLock(ctx))
		must(t, rw.RUnlock(ctx))
		counter.Reset()
		must(t, rw.RLock(ctx))
		must(t, rw.RUnlock(ctx))
		if n := counter.RoundTrips(); n != 2 {
			t.Errorf("RLock+RUnlock took %d round trips, want 2", n)
		}
	})
}
