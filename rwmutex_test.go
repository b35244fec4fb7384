package dsync_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// rwk returns the keys of the RWMutex called name.
func rwk(name string) keys.RWMutex { return keys.ForRWMutex(dsync.DefaultPrefix, name) }

// assertRWReleased checks that a free RWMutex left only bookkeeping with an
// expiry behind: the fence hash and the call ids.
func assertRWReleased(t *testing.T, b redistest.Backend, name string) {
	t.Helper()
	rdb := b.NewClient(t)
	ctx := context.Background()
	ks := rwk(name)
	for _, k := range ks.Keys() {
		n, err := rdb.Exists(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			continue
		}
		if k != ks.Fence && k != ks.Calls {
			t.Errorf("%s left after release", k)
		}
		if ttl, _ := rdb.PTTL(ctx, k).Result(); ttl <= 0 {
			t.Errorf("%s has no expiry (PTTL %v)", k, ttl)
		}
	}
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
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
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
		if err := w.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		assertRWReleased(t, b, name)
	})
}

func TestRWMutexHammer(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		const clients, perClient, rounds = 3, 3, 25
		var readers, writers, maxReaders, reads, writes atomic.Int64
		var bad atomic.Int64
		var wg sync.WaitGroup
		for i := 0; i < clients; i++ {
			c := newClient(t, b)
			for j := 0; j < perClient; j++ {
				rw := c.RWMutex(name)
				wg.Add(1)
				go func() {
					defer wg.Done()
					var gctx context.Context = ctx
					if j == 0 {
						gctx = dsync.WithOwner(ctx)
					}
					for k := 0; k < rounds; k++ {
						pause := time.Duration(rand.IntN(300)) * time.Microsecond
						if rand.IntN(4) == 0 {
							if err := rw.Lock(gctx); err != nil {
								t.Errorf("Lock: %v", err)
								return
							}
							if writers.Add(1) != 1 || readers.Load() != 0 {
								bad.Add(1)
							}
							writes.Add(1)
							time.Sleep(pause)
							writers.Add(-1)
							if err := rw.Unlock(gctx); err != nil {
								t.Errorf("Unlock: %v", err)
								return
							}
							continue
						}
						if err := rw.RLock(gctx); err != nil {
							t.Errorf("RLock: %v", err)
							return
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
							t.Errorf("RUnlock: %v", err)
							return
						}
					}
				}()
			}
		}
		wg.Wait()
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

func TestRWMutexReaderLeaseExpiresAlone(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		// A reader whose process dies: its Client stops renewing.
		dead := dsync.New(b.NewClient(t))
		dr := dead.RWMutex(name, dsync.TTL(300*time.Millisecond))
		if err := dr.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		// Two live readers, renewed (their TTL outlasts the test anyway).
		live1 := newClient(t, b).RWMutex(name)
		live2 := newClient(t, b).RWMutex(name)
		for _, r := range []*dsync.RWMutex{live1, live2} {
			if err := r.RLock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		dead.Close()
		b.Advance(500 * time.Millisecond)

		rdb := b.NewClient(t)
		w := newClient(t, b).RWMutex(name)
		// One reader's unlock leaves the other reader's share alone.
		if err := live1.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
		if ok, err := w.TryLock(ctx); ok || err != nil {
			t.Fatalf("TryLock while a live reader holds = %v, %v; want false", ok, err)
		}
		if n, _ := rdb.ZCard(ctx, rwk(name).Readers).Result(); n != 1 {
			t.Errorf("readers in Redis = %d, want 1 (the dead reader's share expired alone)", n)
		}
		if l, err := live2.RLease(ctx); err != nil || l.Err() != nil {
			t.Fatalf("live reader's lease = %v, %v; want live", l, err)
		}
		if err := live2.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
		if ok, err := w.TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock after the live readers left = %v, %v; want true", ok, err)
		}
		if err := w.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestRWMutexFixedLeaseRunsOut(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		c := newClient(t, b)
		short := c.RWMutex(name, dsync.TTL(200*time.Millisecond), dsync.FixedLease())
		long := c.RWMutex(name)
		if err := short.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := long.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		l, err := short.RLease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b.Advance(250 * time.Millisecond)
		select {
		case <-l.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("fixed read lease did not end")
		}
		if !errors.Is(l.Err(), dsync.ErrLeaseLost) {
			t.Errorf("Err = %v, want ErrLeaseLost", l.Err())
		}
		if err := short.RUnlock(ctx); !errors.Is(err, dsync.ErrLeaseLost) {
			t.Errorf("RUnlock after the lease ran out = %v, want ErrLeaseLost", err)
		}
		if l, err := long.RLease(ctx); err != nil || l.Err() != nil {
			t.Fatalf("the other reader's lease = %v, %v; want live", l, err)
		}
		if err := long.RUnlock(ctx); err != nil {
			t.Fatalf("the other reader's RUnlock = %v", err)
		}
	})
}

func TestRWMutexReentrantOwner(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := dsync.WithOwner(ctxT(t))
		name := redistest.Key(t)
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
		if err := other.RUnlock(octx); !errors.Is(err, dsync.ErrNotHeld) {
			t.Fatalf("RUnlock by another owner = %v, want ErrNotHeld", err)
		}
		for i := 0; i < 3; i++ {
			if ok, _ := other.TryLock(octx); ok {
				t.Fatalf("write lock free after %d of 3 RUnlocks", i)
			}
			if err := rw.RUnlock(ctx); err != nil {
				t.Fatalf("RUnlock %d: %v", i, err)
			}
		}
		if err := rw.RUnlock(ctx); !errors.Is(err, dsync.ErrNotHeld) {
			t.Fatalf("fourth RUnlock = %v, want ErrNotHeld", err)
		}

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
		if err := other.Unlock(octx); !errors.Is(err, dsync.ErrNotHeld) {
			t.Fatalf("Unlock by another owner = %v, want ErrNotHeld", err)
		}
		if err := rw.Unlock(context.Background()); !errors.Is(err, dsync.ErrNotHeld) {
			t.Fatalf("Unlock without owner = %v, want ErrNotHeld", err)
		}
		for i := 0; i < 3; i++ {
			if ok, _ := other.TryRLock(octx); ok {
				t.Fatalf("read lock free after %d of 3 Unlocks", i)
			}
			if err := rw.Unlock(ctx); err != nil {
				t.Fatalf("Unlock %d: %v", i, err)
			}
		}
		if ok, err := other.TryLock(octx); !ok || err != nil {
			t.Fatalf("TryLock after the last Unlock = %v, %v", ok, err)
		}
		l, _ := other.Lease(octx)
		if l.Token() <= fence {
			t.Errorf("next fencing token %d, want > %d", l.Token(), fence)
		}
		if err := other.Unlock(octx); err != nil {
			t.Fatal(err)
		}
		assertRWReleased(t, b, name)
	})
}

func TestRWMutexOwnerAcrossProcesses(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		name := redistest.Key(t)
		a := newClient(t, b).RWMutex(name)
		bm := newClient(t, b).RWMutex(name)
		ctxA := dsync.WithOwner(ctxT(t))
		ctxB := dsync.WithOwnerToken(ctxT(t), dsync.OwnerToken(ctxA))
		if err := a.RLock(ctxA); err != nil {
			t.Fatal(err)
		}
		if ok, err := bm.TryRLock(ctxB); !ok || err != nil {
			t.Fatalf("read re-entry from another process = %v, %v", ok, err)
		}
		if err := bm.RUnlock(ctxB); err != nil {
			t.Fatal(err)
		}
		// The first process's share is still held and renewed.
		if ok, _ := newClient(t, b).RWMutex(name).TryLock(context.Background()); ok {
			t.Fatal("write lock free while the owner still reads")
		}
		if err := a.RUnlock(ctxA); err != nil {
			t.Fatal(err)
		}
		assertRWReleased(t, b, name)
	})
}

func TestRWMutexDowngrade(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := dsync.WithOwner(ctxT(t))
		name := redistest.Key(t)
		rw := newClient(t, b).RWMutex(name)
		other := newClient(t, b).RWMutex(name)
		if err := rw.Lock(ctx); err != nil {
			t.Fatal(err)
		}
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
		if err := rw.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			t.Fatalf("reader got in while the writer re-entered: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if err := rw.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
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
		if err := other.RUnlock(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := rw.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
		if ok, err := w.TryLock(octx); !ok || err != nil {
			t.Fatalf("TryLock after the readers left = %v, %v", ok, err)
		}
		if err := w.Unlock(octx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestRWMutexUpgradeRefused(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := dsync.WithOwner(ctxT(t))
		name := redistest.Key(t)
		rw := newClient(t, b).RWMutex(name)
		if err := rw.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := rw.Lock(ctx); !errors.Is(err, dsync.ErrUpgrade) {
			t.Fatalf("Lock while reading = %v, want ErrUpgrade", err)
		}
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
		if err := rw.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
		// Another process of the same owner reads: still an upgrade.
		other := newClient(t, b).RWMutex(name)
		if err := other.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := rw.Lock(ctx); !errors.Is(err, dsync.ErrUpgrade) {
			t.Fatalf("Lock while the owner reads elsewhere = %v, want ErrUpgrade", err)
		}
		if err := other.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestRWMutexWriterPreference(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		rdb := b.NewClient(t)
		octx := dsync.WithOwner(ctx)
		reader := newClient(t, b).RWMutex(name)
		if err := reader.RLock(octx); err != nil {
			t.Fatal(err)
		}
		writer := newClient(t, b).RWMutex(name)
		wgot := make(chan error, 1)
		go func() { wgot <- writer.Lock(ctx) }()
		waitFor(t, 5*time.Second, "the writer to wait", writerWaits(t, rdb, name))

		// New readers wait behind the waiting writer...
		late := newClient(t, b).RWMutex(name)
		if ok, err := late.TryRLock(ctx); ok || err != nil {
			t.Fatalf("TryRLock while a writer waits = %v, %v; want false", ok, err)
		}
		rgot := make(chan error, 1)
		go func() { rgot <- late.RLock(ctx) }()
		// ...but an owner that already reads re-enters (or it would wait for
		// a writer that waits for it).
		if ok, err := reader.TryRLock(octx); !ok || err != nil {
			t.Fatalf("read re-entry while a writer waits = %v, %v; want true", ok, err)
		}
		for i := 0; i < 2; i++ {
			if err := reader.RUnlock(octx); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case err := <-wgot:
			if err != nil {
				t.Fatalf("writer: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("writer not woken by the last reader")
		}
		select {
		case err := <-rgot:
			t.Fatalf("late reader got in with the writer: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if err := writer.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-rgot:
			if err != nil {
				t.Fatalf("late reader: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("late reader not admitted by the writer's Unlock")
		}
		if err := late.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
		assertRWReleased(t, b, name)
	})
}

func TestRWMutexReadersCannotStarveWriter(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var reads atomic.Int64
		// Readers that overlap: there is always one holding the lock.
		for g := 0; g < 4; g++ {
			rw := newClient(t, b).RWMutex(name)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 100000; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if err := rw.RLock(ctx); err != nil {
						t.Error(err)
						return
					}
					reads.Add(1)
					time.Sleep(5 * time.Millisecond)
					if err := rw.RUnlock(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		defer func() { close(stop); wg.Wait() }()
		waitFor(t, 5*time.Second, "readers to run", func() bool { return reads.Load() > 20 })
		w := newClient(t, b).RWMutex(name)
		for i := 0; i < 3; i++ {
			lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			start := time.Now()
			err := w.Lock(lctx)
			cancel()
			if err != nil {
				t.Fatalf("writer %d starved by readers: %v", i, err)
			}
			t.Logf("writer %d waited %v", i, time.Since(start))
			time.Sleep(2 * time.Millisecond)
			if err := w.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

func TestRWMutexWriterGivingUpUnblocksReaders(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		rdb := b.NewClient(t)
		holder := newClient(t, b).RWMutex(name)
		if err := holder.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		werr := make(chan error, 1)
		go func() { werr <- newClient(t, b).RWMutex(name).Lock(wctx) }()
		waitFor(t, 5*time.Second, "the writer to wait", writerWaits(t, rdb, name))
		const R = 3
		rgot := make(chan time.Time, R)
		var readers sync.WaitGroup
		rctx, rcancel := context.WithCancel(ctx)
		defer func() { rcancel(); readers.Wait() }() // no reader outlives the test
		for i := 0; i < R; i++ {
			rw := newClient(t, b).RWMutex(name)
			readers.Add(1)
			go func() {
				defer readers.Done()
				if err := rw.RLock(rctx); err != nil {
					if rctx.Err() == nil {
						t.Error(err)
					}
					return
				}
				rgot <- time.Now()
				if err := rw.RUnlock(ctx); err != nil {
					t.Error(err)
				}
			}()
		}
		time.Sleep(50 * time.Millisecond)
		if len(rgot) != 0 {
			t.Fatal("a reader got in while a writer waited")
		}
		gaveUp := time.Now()
		cancel()
		if err := <-werr; !errors.Is(err, context.Canceled) {
			t.Fatalf("Lock = %v, want Canceled", err)
		}
		for i := 0; i < R; i++ {
			select {
			case at := <-rgot:
				// The TTL is 30 s: only the cleanup's notification explains
				// a fast entry.
				if d := at.Sub(gaveUp); d > 2*time.Second {
					t.Errorf("reader %d got in %v after the writer gave up", i, d)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("reader still blocked after the writer gave up")
			}
		}
		if err := holder.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "readers to leave", func() bool {
			n, _ := rdb.Exists(ctx, rwk(name).Readers).Result()
			return n == 0
		})
		assertRWReleased(t, b, name)
	})
}

func TestRWMutexWaitersWokenByRelease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		writer := newClient(t, b).RWMutex(name)
		var readers []*dsync.RWMutex
		for i := 0; i < 3; i++ {
			readers = append(readers, newClient(t, b).RWMutex(name))
		}
		const rounds = 10
		var rlat, wlat []time.Duration
		for i := 0; i < rounds; i++ {
			// Readers wait for a writer: all wake at once.
			if err := writer.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			got := make(chan time.Time, len(readers))
			for _, r := range readers {
				go func() {
					if err := r.RLock(ctx); err != nil {
						t.Error(err)
					}
					got <- time.Now()
				}()
			}
			time.Sleep(20 * time.Millisecond)
			released := time.Now()
			if err := writer.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			for range readers {
				rlat = append(rlat, (<-got).Sub(released))
			}
			// A writer waits for the readers: woken by the last RUnlock.
			wgot := make(chan time.Time, 1)
			go func() {
				if err := writer.Lock(ctx); err != nil {
					t.Error(err)
				}
				wgot <- time.Now()
			}()
			time.Sleep(20 * time.Millisecond)
			for _, r := range readers {
				if err := r.RUnlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			released = time.Now()
			wlat = append(wlat, (<-wgot).Sub(released))
			if err := writer.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for _, l := range [][]time.Duration{rlat, wlat} {
			slices.Sort(l)
		}
		rmed, wmed := rlat[len(rlat)/2], wlat[len(wlat)/2]
		t.Logf("readers woken: median %v, max %v; writer woken: median %v, max %v",
			rmed, rlat[len(rlat)-1], wmed, wlat[len(wlat)-1])
		// The TTL is 30 s: only a notification explains a fast wake-up.
		if rmed > 25*time.Millisecond || wmed > 25*time.Millisecond {
			t.Errorf("median wake-up readers %v, writer %v; want under 25ms", rmed, wmed)
		}
		assertRWReleased(t, b, name)
	})
}

func TestRWMutexOneHandleManyReaders(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		rw := newClient(t, b).RWMutex(name)
		const G = 5
		var wg sync.WaitGroup
		for i := 0; i < G; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := rw.RLock(ctx); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if n, _ := b.NewClient(t).ZCard(ctx, rwk(name).Readers).Result(); n != G {
			t.Errorf("readers in Redis = %d, want %d", n, G)
		}
		// Any goroutine may release them, one per RUnlock.
		for i := 0; i < G; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := rw.RUnlock(context.Background()); err != nil {
					t.Errorf("RUnlock: %v", err)
				}
			}()
		}
		wg.Wait()
		if err := rw.RUnlock(ctx); !errors.Is(err, dsync.ErrNotHeld) {
			t.Errorf("extra RUnlock = %v, want ErrNotHeld", err)
		}
		assertRWReleased(t, b, name)
	})
}

func TestRWMutexNotHeld(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		rw := newClient(t, b).RWMutex(name)
		octx := dsync.WithOwner(ctx)
		for _, c := range []context.Context{ctx, octx} {
			if err := rw.RUnlock(c); !errors.Is(err, dsync.ErrNotHeld) {
				t.Errorf("RUnlock of nothing = %v, want ErrNotHeld", err)
			}
			if err := rw.Unlock(c); !errors.Is(err, dsync.ErrNotHeld) {
				t.Errorf("Unlock of nothing = %v, want ErrNotHeld", err)
			}
			if _, err := rw.Lease(c); !errors.Is(err, dsync.ErrNotHeld) {
				t.Errorf("Lease of nothing = %v, want ErrNotHeld", err)
			}
			if _, err := rw.RLease(c); !errors.Is(err, dsync.ErrNotHeld) {
				t.Errorf("RLease of nothing = %v, want ErrNotHeld", err)
			}
		}
		// The modes do not stand in for each other.
		if err := rw.Lock(octx); err != nil {
			t.Fatal(err)
		}
		if err := rw.RUnlock(octx); !errors.Is(err, dsync.ErrNotHeld) {
			t.Errorf("RUnlock while only writing = %v, want ErrNotHeld", err)
		}
		if err := rw.Unlock(octx); err != nil {
			t.Fatal(err)
		}
		if err := rw.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := rw.Unlock(ctx); !errors.Is(err, dsync.ErrNotHeld) {
			t.Errorf("Unlock while only reading = %v, want ErrNotHeld", err)
		}
		// A reader whose share was deleted behind its back is told.
		if err := b.NewClient(t).Del(ctx, rwk(name).Readers, rwk(name).ReaderData).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rw.RUnlock(ctx); !errors.Is(err, dsync.ErrLeaseLost) {
			t.Errorf("RUnlock of a deleted share = %v, want ErrLeaseLost", err)
		}
	})
}

func TestRWMutexCancelLeavesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		holder := newClient(t, b).RWMutex(name)
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		c := newClient(t, b)
		var wg sync.WaitGroup
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				wctx, cancel := context.WithTimeout(ctx, time.Duration(1+rand.IntN(40))*time.Millisecond)
				defer cancel()
				if i%3 == 0 {
					wctx = dsync.WithOwner(wctx)
				}
				rw := c.RWMutex(name)
				lock, unlock := rw.RLock, rw.RUnlock
				if i%2 == 0 {
					lock, unlock = rw.Lock, rw.Unlock
				}
				err := lock(wctx)
				if err == nil {
					// It won the race with its deadline: a hold like any other.
					if err := unlock(wctx); err != nil {
						t.Errorf("unlock: %v", err)
					}
					return
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("lock = %v, want DeadlineExceeded", err)
				}
			}()
		}
		// Release while some waiters are giving up: admissions race with
		// cancellations.
		time.Sleep(20 * time.Millisecond)
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		// A clean-up still running when its call returned finishes in the
		// background (DESIGN: Deadlines); what must be left is nothing.
		dsync.WaitCleanups(c)
		if ok, err := newClient(t, b).RWMutex(name).TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock after every waiter gave up = %v, %v; want true", ok, err)
		}
	})
}

func TestRWMutexLostReplyIsReleased(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		rdb := b.NewClient(t)
		faults := &redistest.Faults{}
		rdb.AddHook(faults)
		c := dsync.New(rdb)
		defer c.Close()
		rw := c.RWMutex(name)
		for _, owned := range []bool{false, true} {
			lctx := ctx
			if owned {
				lctx = dsync.WithOwner(ctx)
			}
			// The server runs the lock script, the reply is lost.
			faults.DropReplyNext(1, context.DeadlineExceeded)
			if err := rw.RLock(lctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("RLock = %v, want the injected error", err)
			}
			faults.DropReplyNext(1, context.DeadlineExceeded)
			if err := rw.Lock(lctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Lock = %v, want the injected error", err)
			}
			w := newClient(t, b).RWMutex(name)
			if ok, err := w.TryLock(ctx); !ok || err != nil {
				t.Fatalf("owned=%v: hold leaked after a lost reply: TryLock = %v, %v", owned, ok, err)
			}
			if err := w.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestRWMutexLostUnlockReplyRetried(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		rdb := b.NewClient(t)
		faults := &redistest.Faults{}
		rdb.AddHook(faults)
		c := dsync.New(rdb)
		defer c.Close()
		rw := c.RWMutex(name)
		octx := dsync.WithOwner(ctx)
		for i := 0; i < 2; i++ {
			if err := rw.RLock(octx); err != nil {
				t.Fatal(err)
			}
		}
		// The first RUnlock runs on the server, its reply is lost; the
		// caller retries, which must not lower the count again.
		faults.DropReplyNext(1, context.DeadlineExceeded)
		if err := rw.RUnlock(octx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("RUnlock = %v, want the injected error", err)
		}
		if err := rw.RUnlock(octx); err != nil {
			t.Fatalf("retried RUnlock = %v", err)
		}
		if ok, _ := newClient(t, b).RWMutex(name).TryLock(ctx); ok {
			t.Fatal("one RUnlock counted twice: write lock free while a read level is held")
		}
		// A full release whose reply is lost, retried: answers as before.
		faults.DropReplyNext(1, context.DeadlineExceeded)
		if err := rw.RUnlock(octx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("RUnlock = %v, want the injected error", err)
		}
		if err := rw.RUnlock(octx); err != nil {
			t.Fatalf("retried last RUnlock = %v, want nil", err)
		}
		if err := rw.RUnlock(octx); !errors.Is(err, dsync.ErrNotHeld) {
			t.Fatalf("RUnlock after release = %v, want ErrNotHeld", err)
		}
	})
}

func TestRWMutexBadInput(t *testing.T) {
	b := redistest.Miniredis(t)
	rdb := b.NewClient(t)
	counter := &redistest.Counter{}
	rdb.AddHook(counter)
	ctx := context.Background()
	c := dsync.New(rdb)
	defer c.Close()
	nilc, badc := dsync.New(nil), dsync.New(rdb, dsync.TTL(0))
	defer nilc.Close()
	defer badc.Close()
	cases := map[string]*dsync.RWMutex{
		"empty name":        c.RWMutex(""),
		"zero TTL":          c.RWMutex("x", dsync.TTL(0)),
		"negative MaxHold":  c.RWMutex("x", dsync.MaxHold(-time.Second)),
		"nil client":        nilc.RWMutex("x"),
		"bad client option": badc.RWMutex("x"),
		"nil handle":        nil,
	}
	for name, rw := range cases {
		if err := rw.RLock(ctx); !errors.Is(err, dsync.ErrInvalid) {
			t.Errorf("%s: RLock = %v, want ErrInvalid", name, err)
		}
		if _, err := rw.TryRLock(ctx); !errors.Is(err, dsync.ErrInvalid) {
			t.Errorf("%s: TryRLock = %v, want ErrInvalid", name, err)
		}
		if err := rw.Lock(ctx); !errors.Is(err, dsync.ErrInvalid) {
			t.Errorf("%s: Lock = %v, want ErrInvalid", name, err)
		}
		if _, err := rw.TryLock(ctx); !errors.Is(err, dsync.ErrInvalid) {
			t.Errorf("%s: TryLock = %v, want ErrInvalid", name, err)
		}
		if err := rw.Unlock(ctx); !errors.Is(err, dsync.ErrInvalid) {
			t.Errorf("%s: Unlock = %v, want ErrInvalid", name, err)
		}
		if err := rw.RUnlock(ctx); !errors.Is(err, dsync.ErrInvalid) {
			t.Errorf("%s: RUnlock = %v, want ErrInvalid", name, err)
		}
		if _, err := rw.RLease(ctx); !errors.Is(err, dsync.ErrInvalid) {
			t.Errorf("%s: RLease = %v, want ErrInvalid", name, err)
		}
	}
	bad := dsync.WithOwnerToken(ctx, "")
	if err := c.RWMutex("x").RLock(bad); !errors.Is(err, dsync.ErrInvalid) {
		t.Errorf("empty owner token: RLock = %v, want ErrInvalid", err)
	}
	if n := counter.RoundTrips(); n != 0 {
		t.Errorf("bad input sent %d commands, want 0", n)
	}
	c2 := dsync.New(rdb)
	rw := c2.RWMutex("x")
	c2.Close()
	if err := rw.RLock(ctx); !errors.Is(err, dsync.ErrClosed) {
		t.Errorf("RLock after Close = %v, want ErrClosed", err)
	}
}

func TestRWMutexUncontendedRoundTrips(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		rdb := b.NewClient(t)
		counter := &redistest.Counter{}
		rdb.AddHook(counter)
		c := dsync.New(rdb)
		defer c.Close()
		rw := c.RWMutex(redistest.Key(t))
		// Load the scripts.
		if err := rw.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := rw.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
		counter.Reset()
		if err := rw.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := rw.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
		if n := counter.RoundTrips(); n != 2 {
			t.Errorf("RLock+RUnlock took %d round trips, want 2", n)
		}
	})
}

func TestRWMutexLongWaitKeepsLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		// Renewed every 200 ms: a renewal may come 400 ms late (a loaded
		// machine) before a lease runs out.
		const ttl = 600 * time.Millisecond
		writer := newClient(t, b).RWMutex(name)
		if err := writer.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		// Readers and a writer that wait much longer than their TTL.
		reader := newClient(t, b).RWMutex(name, dsync.TTL(ttl))
		w2 := newClient(t, b).RWMutex(name, dsync.TTL(ttl))
		rgot := make(chan error, 1)
		go func() { rgot <- reader.RLock(ctx) }()
		time.Sleep(2 * ttl)
		if err := writer.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-rgot; err != nil {
			t.Fatal(err)
		}
		wgot := make(chan error, 1)
		go func() { wgot <- w2.Lock(ctx) }()
		time.Sleep(2 * ttl)
		l, err := reader.RLease(ctx)
		if err != nil || l.Err() != nil {
			t.Fatalf("admitted reader's lease after %v = %v, %v; want live", 2*ttl, l, err)
		}
		if err := reader.RUnlock(ctx); err != nil {
			t.Fatalf("RUnlock = %v", err)
		}
		if err := <-wgot; err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * ttl)
		if l, err := w2.Lease(ctx); err != nil || l.Err() != nil {
			t.Fatalf("writer's lease after a long wait = %v, %v; want live", l, err)
		}
		if err := w2.Unlock(ctx); err != nil {
			t.Fatalf("Unlock = %v", err)
		}
	})
}

// With client reentrancy an owner token carried to another process does
// not re-enter there, for writes nor reads: a write waits like any other
// owner's, and a read through it is a hold of its own, so that the first
// process's RUnlock leaves it in place and a writer stays out.
func TestRWMutexClientReentrancyCarriedToken(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := dsync.WithOwner(ctxT(t))
		name := redistest.Key(t)
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
				rdb := b.NewClient(t)
				counter := &redistest.Counter{}
				rdb.AddHook(counter)
				c := dsync.New(rdb, mode.opts...)
				defer c.Close()
				rw := c.RWMutex(name)
				other := newClient(t, b).RWMutex(name)
				octx := dsync.WithOwner(context.Background())
				check := b.NewClient(t)
				tok := dsync.OwnerToken(ctx)
				// Load the scripts where the name lives.
				for _, f := range []func(context.Context) error{rw.RLock, rw.RUnlock, rw.Lock, rw.Unlock} {
					if err := f(ctx); err != nil {
						t.Fatal(err)
					}
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
						if err := other.Unlock(octx); err != nil {
							t.Fatal(err)
						}
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
				ok, err := other.TryLock(octx)
				if !ok || err != nil {
					t.Fatalf("TryLock after the owner left = %v, %v", ok, err)
				}
				if l, _ := other.Lease(octx); l.Token() <= fence {
					t.Errorf("next fencing token %d, want > %d", l.Token(), fence)
				}
				if err := other.Unlock(octx); err != nil {
					t.Fatal(err)
				}
				assertRWReleased(t, b, name)
			})
		}
	})
}

// TestRWMutexClientReentrancyLeaseLoss loses a hold of three levels behind
// its owner's back: in both reentrancy modes the first unlock reports the
// loss and the others find nothing held.
func TestRWMutexClientReentrancyLeaseLoss(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, mode := range reentrancyModes {
			for _, lock := range []string{"read", "write"} {
				t.Run(mode.name+"/"+lock, func(t *testing.T) {
					ctx := dsync.WithOwner(ctxT(t))
					name := redistest.Key(t)
					const ttl = 600 * time.Millisecond
					rw := newClient(t, b, append([]dsync.Option{dsync.TTL(ttl)}, mode.opts...)...).RWMutex(name)
					acquire, release, lease := rw.Lock, rw.Unlock, rw.Lease
					keys := []string{rwk(name).Writer}
					if lock == "read" {
						acquire, release, lease = rw.RLock, rw.RUnlock, rw.RLease
						keys = []string{rwk(name).Readers, rwk(name).ReaderData}
					}
					for i := 0; i < 3; i++ {
						if err := acquire(ctx); err != nil {
							t.Fatal(err)
						}
					}
					l, err := lease(ctx)
					if err != nil {
						t.Fatal(err)
					}
					// The hold vanishes behind the owner's back.
					if err := b.NewClient(t).Del(ctx, keys...).Err(); err != nil {
						t.Fatal(err)
					}
					waitDone(t, l, 3*ttl)
					if !errors.Is(l.Err(), dsync.ErrLeaseLost) {
						t.Errorf("Err = %v, want ErrLeaseLost", l.Err())
					}
					// Each of the three levels is gone: the first unlock says
					// so, the others find nothing.
					if err := release(ctx); !errors.Is(err, dsync.ErrLeaseLost) {
						t.Errorf("first unlock after the loss = %v, want ErrLeaseLost", err)
					}
					for i := 0; i < 2; i++ {
						if err := release(ctx); !errors.Is(err, dsync.ErrNotHeld) {
							t.Errorf("unlock %d after the loss = %v, want ErrNotHeld", i+2, err)
						}
					}
					if _, err := lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
						t.Errorf("lease after the loss = %v, want ErrNotHeld", err)
					}
					// A new lock is a fresh hold, released by one unlock.
					if err := acquire(ctx); err != nil {
						t.Fatal(err)
					}
					if l2, err := lease(ctx); err != nil || l2.Err() != nil {
						t.Fatalf("lease of the new hold = %v, %v; want live", l2, err)
					}
					if err := release(ctx); err != nil {
						t.Fatal(err)
					}
					if err := release(ctx); !errors.Is(err, dsync.ErrNotHeld) {
						t.Errorf("extra unlock = %v, want ErrNotHeld", err)
					}
					assertRWReleased(t, b, name)
				})
			}
		}
	})
}

// queueWriter waits until the waiting writer with owner token tok has a
// place in the writers' queue. A writer queues when an attempt finds that
// it has waited past the starvation threshold, so each poll that finds it
// not queued yet sends a release notification, which makes it try again.
func queueWriter(t *testing.T, rdb redis.UniversalClient, name, tok string) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, 5*time.Second, "the writer to queue", func() bool {
		if err := rdb.ZScore(ctx, rwk(name).WriterQueue, tok).Err(); err == nil {
			return true
		}
		if err := rdb.Publish(ctx, rwk(name).Channel(), "").Err(); err != nil {
			t.Error(err)
			return true
		}
		return false
	})
	// Let an attempt that the last notification caused finish.
	time.Sleep(20 * time.Millisecond)
}

// TestRWMutexHandOverMakesWaiterOwner: a release that frees the lock (an
// Unlock, or the last reader's RUnlock) hands it to the queued writer, whose
// Lock then returns holding it without another round trip.
func TestRWMutexHandOverMakesWaiterOwner(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, by := range []string{"Unlock", "RUnlock"} {
			t.Run("by="+by, func(t *testing.T) {
				ctx := ctxT(t)
				name := redistest.Key(t)
				rdb := b.NewClient(t)
				hctx := dsync.WithOwner(ctx)
				holder := newClient(t, b).RWMutex(name)
				lock, unlock := holder.Lock, holder.Unlock
				if by == "RUnlock" {
					lock, unlock = holder.RLock, holder.RUnlock
				}
				if err := lock(hctx); err != nil {
					t.Fatal(err)
				}
				var before uint64
				if l, err := holder.Lease(hctx); err == nil {
					before = l.Token()
				}

				wrdb := b.NewClient(t)
				counter := &redistest.Counter{}
				wrdb.AddHook(counter)
				wc := dsync.New(wrdb)
				defer wc.Close()
				waiter := wc.RWMutex(name)
				wctx := dsync.WithOwner(ctx)
				wtok := dsync.OwnerToken(wctx)
				got := make(chan error, 1)
				go func() { got <- waiter.Lock(wctx) }()
				queueWriter(t, rdb, name, wtok)

				counter.Reset()
				if err := unlock(hctx); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-got:
					if err != nil {
						t.Fatalf("waiter's Lock: %v", err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("the queued writer did not get the lock")
				}
				if n := counter.RoundTrips(); n != 0 {
					t.Errorf("the queued writer took %d round trips after the release, want 0", n)
				}
				l, err := waiter.Lease(wctx)
				if err != nil || l.Err() != nil {
					t.Fatalf("Lease of the handed-over hold = %v, %v; want live", l, err)
				}
				if l.Token() <= before {
					t.Errorf("fencing token of the handed-over hold = %d, want > %d", l.Token(), before)
				}
				h, err := rdb.HGetAll(ctx, rwk(name).Writer).Result()
				if err != nil {
					t.Fatal(err)
				}
				if h[wtok] != "1" || h[":f"] != strconv.FormatUint(l.Token(), 10) {
					t.Errorf("writer hash = %v, want %s holding it once with token %d", h, wtok, l.Token())
				}
				if ok, _ := newClient(t, b).RWMutex(name).TryRLock(ctx); ok {
					t.Fatal("a reader got in beside the handed-over writer")
				}
				if err := waiter.Unlock(wctx); err != nil {
					t.Fatal(err)
				}
				assertRWReleased(t, b, name)
			})
		}
	})
}

func TestRWMutexCancelledQueuedWriterLeavesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		rdb := b.NewClient(t)
		holder := newClient(t, b).RWMutex(name)
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		// Two queued writers; the first in line gives up.
		fc := newClient(t, b)
		first := fc.RWMutex(name)
		fctx, cancel := context.WithCancel(dsync.WithOwner(ctx))
		defer cancel()
		ftok := dsync.OwnerToken(fctx)
		fgot := make(chan error, 1)
		go func() { fgot <- first.Lock(fctx) }()
		queueWriter(t, rdb, name, ftok)
		second := newClient(t, b).RWMutex(name)
		sctx := dsync.WithOwner(ctx)
		stok := dsync.OwnerToken(sctx)
		sgot := make(chan error, 1)
		go func() { sgot <- second.Lock(sctx) }()
		queueWriter(t, rdb, name, stok)
		if q, _ := rdb.ZRange(ctx, rwk(name).WriterQueue, 0, -1).Result(); !slices.Equal(q, []string{ftok, stok}) {
			t.Fatalf("queue = %v, want [%s %s]", q, ftok, stok)
		}
		for _, s := range []string{rwk(name).WriterQueue, rwk(name).WriterQueueData, rwk(name).WaitingWriters} {
			if ttl, _ := rdb.PTTL(ctx, s).Result(); ttl <= 0 {
				t.Errorf("%s has no expiry while writers wait (PTTL %v)", s, ttl)
			}
		}

		cancel()
		if err := <-fgot; !errors.Is(err, context.Canceled) {
			t.Fatalf("Lock = %v, want Canceled", err)
		}
		dsync.WaitCleanups(fc) // the clean-up may outlive the call
		if err := rdb.ZScore(ctx, rwk(name).WriterQueue, ftok).Err(); !errors.Is(err, redis.Nil) {
			t.Errorf("the cancelled writer's queue place is left: %v", err)
		}
		if err := rdb.ZScore(ctx, rwk(name).WaitingWriters, ftok).Err(); !errors.Is(err, redis.Nil) {
			t.Errorf("the cancelled writer's waiting place is left: %v", err)
		}
		if ok, _ := rdb.HExists(ctx, rwk(name).WriterQueueData, ftok).Result(); ok {
			t.Error("the cancelled writer's queue record is left")
		}
		// The next in line gets the lock from the holder's Unlock.
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-sgot:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the second writer did not get the lock")
		}
		if err := second.Unlock(sctx); err != nil {
			t.Fatal(err)
		}
		assertRWReleased(t, b, name)
	})
}

// TestRWMutexAbandonedHandOver: a hold handed to a queued writer whose call
// its caller abandoned (the hand-over raced with its ctx) is released by
// the call's cleanup, and the call arriving late takes nothing.
func TestRWMutexAbandonedHandOver(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		rdb := b.NewClient(t)
		keys := rwk(name).Keys()
		holder := newClient(t, b).RWMutex(name)
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		// A writer's starving lock call, as its caller sends it.
		const tok, id = "abandoning-writer", "lock-call"
		const secret = "the-call-secret"
		lockArgs := []any{"w", tok, 60000, id, "1", 86400000, "0", "1", secret}
		lockScript := lua.Script("rwmutex_lock")
		if v, err := lockScript.Run(ctx, rdb, keys, lockArgs...).Int64Slice(); err != nil || v[0] != 0 {
			t.Fatalf("lock call = %v, %v; want refused", v, err)
		}
		ps := rdb.Subscribe(ctx, rwk(name).Channel())
		defer ps.Close()
		if _, err := ps.Receive(ctx); err != nil {
			t.Fatal(err)
		}
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-ps.Channel():
			// "<call id> <sha1(holder)> <fencing token> <sha1(secret token)>"
			f := strings.Fields(m.Payload)
			if len(f) != 4 || f[0] != id || f[1] != sha1hex(tok) || f[3] != sha1hex(secret+" "+f[2]) {
				t.Fatalf("notification %q, want a proven hand-over to %s's call %s", m.Payload, tok, id)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no hand-over notification")
		}
		if n, _ := rdb.HGet(ctx, keys[0], tok).Result(); n != "1" {
			t.Fatalf("count of the handed-over hold = %q, want 1", n)
		}
		// The caller gave up before it saw the notification: the cleanup
		// releases the hold the call was handed.
		got, err := lua.Script("rwmutex_unlock").Run(ctx, rdb, keys, "w", tok, "cleanup", keys[0], "", id, "", 86400000).Int64()
		if err != nil || got != 1 {
			t.Fatalf("cleanup = %v, %v; want 1 (released)", got, err)
		}
		// The call arriving late (a go-redis retry) takes nothing.
		if v, err := lockScript.Run(ctx, rdb, keys, lockArgs...).Int64Slice(); err != nil || v[0] != 0 {
			t.Fatalf("late lock call = %v, %v; want refused", v, err)
		}
		for _, k := range []string{rwk(name).Writer, rwk(name).WaitingWriters, rwk(name).WriterQueue} {
			if n, _ := rdb.Exists(ctx, k).Result(); n != 0 {
				t.Errorf("%s exists after the late call", k)
			}
		}
		other := newClient(t, b).RWMutex(name)
		if ok, err := other.TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock after the cleanup = %v, %v; want true", ok, err)
		}
		if err := other.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		assertRWReleased(t, b, name)
	})
}

func TestRWMutexNoWriterStarvation(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		// 32 writers over 4 processes, as in the contended benchmark: without
		// a queue, most wake-ups find the lock taken again, and some writers
		// hardly ever get it.
		const clients, G = 4, 32
		var cs []*dsync.Client
		for i := 0; i < clients; i++ {
			cs = append(cs, newClient(t, b))
		}
		var ls []locker
		for g := 0; g < G; g++ {
			ls = append(ls, cs[g%clients].RWMutex(name))
		}
		lo, hi, n := contend(t, ctx, ls, 1500*time.Millisecond)
		t.Logf("acquisitions per writer: fewest %d, most %d", lo, hi)
		if n != 0 {
			t.Errorf("two writers held the lock at once %d times", n)
		}
		if lo == 0 || float64(lo) < 0.5*float64(hi) {
			t.Errorf("fewest/most = %d/%d, want ≥ 0.5 (no writer starves)", lo, hi)
		}
		assertRWReleased(t, b, name)
	})
}

func sha1hex(s string) string {
	d := sha1.Sum([]byte(s))
	return hex.EncodeToString(d[:])
}
