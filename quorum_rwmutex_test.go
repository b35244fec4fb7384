package dsync_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// miniMasters returns n miniredis masters, one client each.
func miniMasters(t *testing.T, n int) []redis.UniversalClient {
	t.Helper()
	var rdbs []redis.UniversalClient
	for range n {
		rdbs = append(rdbs, redistest.Miniredis(t).NewClient(t))
	}
	return rdbs
}

// rwHammer runs, on every client, two writers and three readers of the
// RWMutex name, rounds times each, and checks that a writer was alone and
// that write tokens rose.
func rwHammer(t *testing.T, cs []*dsync.Quorum, name string, rounds int) {
	t.Helper()
	ctx := ctxT(t)
	var readers, writers, maxReaders, bad, total atomic.Int64
	var tokens rising
	var wg sync.WaitGroup
	for _, c := range cs {
		for g := range 5 {
			rw := c.RWMutex(name)
			writer := g < 2
			lock, unlock, in := rw.RLock, rw.RUnlock, &readers
			if writer {
				lock, unlock, in = rw.Lock, rw.Unlock, &writers
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					if err := lock(ctx); err != nil {
						t.Errorf("lock (writer %v): %v", writer, err)
						return
					}
					n := in.Add(1)
					if writers.Load() > 0 && (readers.Load() > 0 || writers.Load() > 1) {
						bad.Add(1)
					}
					if !writer && n > maxReaders.Load() {
						maxReaders.Store(n) // a lower bound: racy but never too high
					}
					if writer {
						tokens.check(t, ctx, rw.Lease)
					}
					total.Add(1)
					time.Sleep(time.Millisecond)
					in.Add(-1)
					if err := unlock(ctx); err != nil {
						t.Errorf("unlock (writer %v): %v", writer, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if n := bad.Load(); n != 0 {
		t.Errorf("%d times a writer was not alone", n)
	}
	if got, want := total.Load(), int64(len(cs)*5*rounds); got != want {
		t.Errorf("acquisitions = %d, want %d", got, want)
	}
	t.Logf("most readers at once: %d", maxReaders.Load())
}

// Quorum RWMutex on miniredis: readers share, a writer is alone, across two
// quorum Clients.
func TestQuorumRWMutexMiniredisHammer(t *testing.T) {
	rdbs := miniMasters(t, 3)
	name := redistest.Key(t)
	rwHammer(t, []*dsync.Quorum{newQuorum(t, rdbs), newQuorum(t, rdbs)}, name, 8)

	// Readers of two Clients share it; a writer of either is refused.
	ctx := ctxT(t)
	a, b := newQuorum(t, rdbs).RWMutex(name), newQuorum(t, rdbs).RWMutex(name)
	for _, rw := range []*dsync.RWMutex{a, b} {
		if ok, err := rw.TryRLock(ctx); !ok || err != nil {
			t.Fatalf("TryRLock beside another reader = %v, %v; want true", ok, err)
		}
	}
	if ok, err := a.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock while two read = %v, %v; want false, nil", ok, err)
	}
	for _, rw := range []*dsync.RWMutex{a, b} {
		must(t, rw.RUnlock(ctx))
	}
	if ok, err := a.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock after the readers left = %v, %v; want true", ok, err)
	}
	if ok, err := b.TryRLock(ctx); ok || err != nil {
		t.Fatalf("TryRLock while a writer holds = %v, %v; want false, nil", ok, err)
	}
	must(t, a.Unlock(ctx))
	mustIs(t, a.Unlock(ctx), dsync.ErrNotHeld, "extra Unlock = %v, want ErrNotHeld")
}

func TestQuorumRWMutexReentrancyAndLeases(t *testing.T) {
	rdbs := miniMasters(t, 3)
	ctx := dsync.WithOwner(ctxT(t))
	name := redistest.Key(t)
	rw := newQuorum(t, rdbs).RWMutex(name)
	other := newQuorum(t, rdbs).RWMutex(name)

	for range 2 {
		must(t, rw.Lock(ctx))
	}
	wl, err := rw.Lease(ctx)
	if err != nil || wl.Token() == 0 {
		t.Fatalf("Lease = %v, %v; want a token", wl, err)
	}
	// A downgrade: read while writing, then leave the write lock.
	must(t, rw.RLock(ctx))
	rl, err := rw.RLease(ctx)
	if err != nil || rl.Token() != 0 {
		t.Fatalf("RLease = %v, %v; want token 0", rl, err)
	}
	must(t, rw.Unlock(ctx))
	if ok, _ := other.TryRLock(ctxT(t)); ok {
		t.Fatal("another reader got in while the owner still writes (1 of 2 levels left)")
	}
	must(t, rw.Unlock(ctx))
	select {
	case <-wl.Done():
		if wl.Err() != nil {
			t.Fatalf("write Lease.Err after Unlock = %v, want nil", wl.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("write lease not done after the last Unlock")
	}
	if _, err := rw.Lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
		t.Fatalf("Lease after Unlock = %v, want ErrNotHeld", err)
	}
	// The read hold kept by the downgrade is shared, and blocks writers.
	if ok, err := other.TryRLock(ctxT(t)); !ok || err != nil {
		t.Fatalf("TryRLock beside the downgraded reader = %v, %v", ok, err)
	}
	if ok, _ := newQuorum(t, rdbs).RWMutex(name).TryLock(ctxT(t)); ok {
		t.Fatal("a writer got in beside two readers")
	}
	must(t, other.RUnlock(ctxT(t)))
	// Read re-entry.
	must(t, rw.RLock(ctx))
	for i := range 2 {
		if err := rw.RUnlock(ctx); err != nil {
			t.Fatalf("RUnlock %d: %v", i, err)
		}
	}
	if _, err := rw.RLease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
		t.Fatalf("RLease after the last RUnlock = %v, want ErrNotHeld", err)
	}
	mustIs(t, rw.RUnlock(ctx), dsync.ErrNotHeld, "extra RUnlock = %v, want ErrNotHeld")
	if ok, err := other.TryLock(ctxT(t)); !ok || err != nil {
		t.Fatalf("TryLock after every hold was released = %v, %v", ok, err)
	}
	_ = other.Unlock(ctxT(t))
}

func TestQuorumRWMutexUpgrade(t *testing.T) {
	rdbs := miniMasters(t, 3)
	ctx := dsync.WithOwner(ctxT(t))
	name := redistest.Key(t)
	rw := newQuorum(t, rdbs).RWMutex(name)
	must(t, rw.RLock(ctx))
	mustIs(t, rw.Lock(ctx), dsync.ErrUpgrade, "Lock while reading = %v, want ErrUpgrade")
	if ok, err := rw.TryLock(ctx); ok || !errors.Is(err, dsync.ErrUpgrade) {
		t.Fatalf("TryLock while reading = %v, %v; want false, ErrUpgrade", ok, err)
	}
	// The refused upgrade left no writer place behind: readers still come in.
	other := newQuorum(t, rdbs).RWMutex(name)
	if ok, err := other.TryRLock(ctxT(t)); !ok || err != nil {
		t.Fatalf("TryRLock after a refused upgrade = %v, %v; want true", ok, err)
	}
	_ = other.RUnlock(ctxT(t))
	must(t, rw.RUnlock(ctx))
	if err := rw.Lock(ctx); err != nil {
		t.Fatalf("Lock after RUnlock = %v", err)
	}
	_ = rw.Unlock(ctx)
}

// A waiting reader is woken by the writer's Unlock, and a waiting writer by
// the last reader's RUnlock, not by a timer (the TTL is long).
func TestQuorumRWMutexWakesOnRelease(t *testing.T) {
	rdbs := miniMasters(t, 3)
	ctx := ctxT(t)
	name := redistest.Key(t)
	w := newQuorum(t, rdbs).RWMutex(name)
	r := newQuorum(t, rdbs).RWMutex(name)
	await := func(what string, got chan error, unlock func() error) {
		t.Helper()
		time.Sleep(30 * time.Millisecond)
		select {
		case err := <-got:
			t.Fatalf("%s before the release: %v", what, err)
		default:
		}
		must(t, unlock())
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s not woken by the release", what)
		}
	}
	must(t, w.Lock(ctx))
	got := make(chan error, 1)
	go func() { got <- r.RLock(ctx) }()
	await("RLock", got, func() error { return w.Unlock(ctx) })
	go func() { got <- w.Lock(ctx) }()
	await("Lock", got, func() error { return r.RUnlock(ctx) })
	// While the writer waited it held back new readers; now it holds.
	if ok, _ := r.TryRLock(ctx); ok {
		t.Fatal("a reader got in while the writer holds")
	}
	must(t, w.Unlock(ctx))
	// A cancelled waiter leaves nothing behind.
	must(t, w.Lock(ctx))
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	mustIs(t, r.RLock(short), context.DeadlineExceeded, "RLock with a short ctx = %v, want DeadlineExceeded")
	must(t, w.Unlock(ctx))
	if ok, err := w.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock after the cancelled reader = %v, %v; want true", ok, err)
	}
	_ = w.Unlock(ctx)
}

func TestQuorumRWMutexMinorityDown(t *testing.T) { minorityDown(t, rwHammer, 6) }

func TestQuorumRWMutexClientReentrancy(t *testing.T) {
	rdbs := miniMasters(t, 3)
	counters := make([]*redistest.Counter, len(rdbs))
	for i, rdb := range rdbs {
		counters[i] = &redistest.Counter{}
		rdb.AddHook(counters[i])
	}
	trips := func() (n int64) {
		for _, c := range counters {
			n += c.RoundTrips()
			c.Reset()
		}
		return n
	}
	ctx := dsync.WithOwner(ctxT(t))
	name := redistest.Key(t)
	rw := newQuorum(t, rdbs, dsync.ClientReentrancy()).RWMutex(name)
	steps := []struct {
		what string
		call func(context.Context) error
		rt   int64 // round trips over all masters
	}{
		{"first Lock", rw.Lock, 3},
		{"Lock re-entry", rw.Lock, 0},
		{"RLock by the writer", rw.RLock, 3},
		{"RLock re-entry", rw.RLock, 0},
		{"inner Unlock", rw.Unlock, 0},
		{"last Unlock", rw.Unlock, 3},
		{"inner RUnlock", rw.RUnlock, 0},
		{"last RUnlock", rw.RUnlock, 3},
	}
	// Load the scripts on every master.
	for _, f := range []func(context.Context) error{rw.Lock, rw.RLock, rw.RUnlock, rw.Unlock} {
		must(t, f(ctx))
	}
	trips()
	for _, s := range steps {
		if err := s.call(ctx); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		if got := trips(); got != s.rt {
			t.Errorf("%s took %d round trips, want %d", s.what, got, s.rt)
		}
	}
	if ok, err := newQuorum(t, rdbs).RWMutex(name).TryLock(ctxT(t)); !ok || err != nil {
		t.Fatalf("TryLock after the owner left = %v, %v; want true", ok, err)
	}
}

// A reader's hold granted by masters 0 and 1 (master 2 refused it: a
// writer holds it there) is released by RUnlock also when master 1 is
// slower to answer than master 2: master 2's answer (it holds nothing of
// the hold) decides nothing, so the unlock waits for master 1 rather than
// cutting it off as a straggler and reading the hold as lost.
func TestQuorumUnlockWaitsForTheMastersThatGranted(t *testing.T) {
	ctx, name := ctxT(t), redistest.Key(t)
	var rdbs, slow []redis.UniversalClient
	for i := range 3 {
		b := redistest.Miniredis(t)
		rdbs = append(rdbs, b.NewClient(t))
		s := b.NewClient(t)
		if i == 1 {
			s.AddHook(slowScript{sha: lua.Script("rwmutex_unlock").Hash(), d: 300 * time.Millisecond})
		}
		slow = append(slow, s)
	}
	writer := dsync.New(rdbs[2])
	t.Cleanup(func() { writer.Close() })
	must(t, writer.RWMutex(name).Lock(ctx))
	rw := newQuorum(t, slow).RWMutex(name)
	must(t, rw.RLock(ctx))
	if err := rw.RUnlock(ctx); err != nil {
		t.Fatalf("RUnlock of a read hold two masters granted, one of them slow to answer = %v, want nil", err)
	}
}
