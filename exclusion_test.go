package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A re-entry through a handle with a shorter TTL never moves the hold's
// expiry earlier (Mutex and RWMutex write).
func TestReentryNeverShortensExpiry(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := dsync.WithOwner(ctxT(t))
		name := redistest.Key(t)
		c := newClient(t, b)
		rdb := b.NewClient(t)
		check := func(what, key string) {
			t.Helper()
			if d, err := rdb.PTTL(ctx, key).Result(); err != nil || d < 20*time.Second {
				t.Fatalf("%s: PTTL after a re-entry with TTL 200ms = %v, %v; want the 30s hold's", what, d, err)
			}
		}
		long, short := c.Mutex(name, dsync.TTL(30*time.Second)), c.Mutex(name, dsync.TTL(200*time.Millisecond))
		if err := long.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := short.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		check("Mutex", mutexKeys(name).Lock)
		rwLong, rwShort := c.RWMutex(name, dsync.TTL(30*time.Second)), c.RWMutex(name, dsync.TTL(200*time.Millisecond))
		if err := rwLong.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := rwShort.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		check("RWMutex", rwk(name).Writer)
		for _, f := range []func(context.Context) error{short.Unlock, long.Unlock, rwShort.Unlock, rwLong.Unlock} {
			if err := f(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// A Mutex handle without an owner stays locked from Lock to Unlock also when
// its hold was lost: a second Lock through it waits, the Unlock reports the
// loss and leaves the new holder's hold alone, and the lost Lease keeps
// reporting ErrLeaseLost.
func TestHandleStaysLockedAfterLeaseLoss(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		m := newClient(t, b).Mutex(name)
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		l, err := m.Lease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.NewClient(t).Del(ctx, mutexKeys(name).Lock).Err(); err != nil {
			t.Fatal(err)
		}
		// The handle was not unlocked: a second Lock through it waits,
		// although the name is free in Redis.
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err = m.Lock(wctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("second Lock through the handle = %v, want DeadlineExceeded", err)
		}
		other := newClient(t, b).Mutex(name)
		if err := other.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Unlock(ctx); !errors.Is(err, dsync.ErrLeaseLost) {
			t.Fatalf("Unlock of the lost hold = %v, want ErrLeaseLost", err)
		}
		if err := l.Err(); !errors.Is(err, dsync.ErrLeaseLost) {
			t.Fatalf("lost Lease Err = %v, want ErrLeaseLost", err)
		}
		if ok, err := newClient(t, b).Mutex(name).TryLock(ctx); ok || err != nil {
			t.Fatalf("TryLock while the other holder holds = %v, %v; the lost hold's Unlock released it", ok, err)
		}
		if err := other.Unlock(ctx); err != nil {
			t.Fatalf("the other holder's Unlock = %v", err)
		}
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Err(); !errors.Is(err, dsync.ErrLeaseLost) {
			t.Fatalf("lost Lease Err after the handle locked again = %v, want ErrLeaseLost", err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// An owner whose hold was lost (its keys deleted) and who then takes the
// name afresh (a new fencing token) is told of the loss: the first hold's
// Lease reports ErrLeaseLost, not a release, since nobody released it. A
// goroutine of the owner that still relies on the first hold learns that
// it is gone.
func TestOwnerHoldReplacedAfterLossIsLost(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := dsync.WithOwner(ctxT(t))
		name := redistest.Key(t)
		c := newClient(t, b)
		rdb := b.NewClient(t)
		m := c.Mutex(name + "-m")
		rw := c.RWMutex(name + "-rw")
		s := c.Semaphore(name+"-s", 2)
		cases := []struct {
			what   string
			lock   func() error
			lease  func() (*dsync.Lease, error)
			keys   []string
			unlock func() error
		}{
			{"Mutex", func() error { return m.Lock(ctx) }, func() (*dsync.Lease, error) { return m.Lease(ctx) },
				[]string{mutexKeys(name + "-m").Lock}, func() error { return m.Unlock(ctx) }},
			{"RWMutex", func() error { return rw.Lock(ctx) }, func() (*dsync.Lease, error) { return rw.Lease(ctx) },
				[]string{rwk(name + "-rw").Writer}, func() error { return rw.Unlock(ctx) }},
			{"Semaphore", func() error { return s.Acquire(ctx, 1) }, func() (*dsync.Lease, error) { return s.Lease(ctx) },
				[]string{semKeys(name + "-s").State, semKeys(name + "-s").Holders}, func() error { return s.Release(ctx, 1) }},
		}
		for _, tc := range cases {
			if err := tc.lock(); err != nil {
				t.Fatalf("%s: %v", tc.what, err)
			}
			first, err := tc.lease()
			if err != nil {
				t.Fatalf("%s: %v", tc.what, err)
			}
			if err := rdb.Del(ctx, tc.keys...).Err(); err != nil {
				t.Fatal(err)
			}
			// Another goroutine of the owner takes the name afresh.
			if err := tc.lock(); err != nil {
				t.Fatalf("%s: lock after the loss: %v", tc.what, err)
			}
			second, err := tc.lease()
			if err != nil {
				t.Fatalf("%s: %v", tc.what, err)
			}
			if second.Token() <= first.Token() {
				t.Fatalf("%s: token %d after the loss, want above %d (a fresh hold)", tc.what, second.Token(), first.Token())
			}
			if err := first.Err(); !errors.Is(err, dsync.ErrLeaseLost) {
				t.Fatalf("%s: the lost hold's Lease Err = %v, want ErrLeaseLost", tc.what, err)
			}
			if err := second.Err(); err != nil {
				t.Fatalf("%s: the new hold's Lease Err = %v", tc.what, err)
			}
			if err := tc.unlock(); err != nil {
				t.Fatalf("%s: unlock of the new hold: %v", tc.what, err)
			}
		}
	})
}

// A Semaphore handle without an owner whose holding was lost still owes
// its permits: a Release of them reports the loss and leaves the holding a
// later Acquire through the handle took alone, so the semaphore never has
// more holders than permits.
func TestSemaphoreHandleOwesLostPermits(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		s := newClient(t, b).Semaphore(name, 1)
		other := newClient(t, b).Semaphore(name, 1)
		if err := s.Acquire(ctx, 1); err != nil { // G1
			t.Fatal(err)
		}
		lost, err := s.Lease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		k := semKeys(name)
		if err := b.NewClient(t).Del(ctx, k.State, k.Holders).Err(); err != nil {
			t.Fatal(err)
		}
		if err := s.Acquire(ctx, 1); err != nil { // G2, through the same handle
			t.Fatal(err)
		}
		if err := lost.Err(); !errors.Is(err, dsync.ErrLeaseLost) {
			t.Fatalf("the first holding's Lease Err = %v, want ErrLeaseLost", err)
		}
		// G1 releases its permit: the loss is reported, G2's permit stays.
		if err := s.Release(ctx, 1); !errors.Is(err, dsync.ErrLeaseLost) {
			t.Fatalf("Release of the lost permit = %v, want ErrLeaseLost", err)
		}
		if ok, err := other.TryAcquire(ctx, 1); err != nil || ok {
			t.Fatalf("another process's TryAcquire while G2 holds = %v, %v; want false", ok, err)
		}
		l, err := s.Lease(ctx)
		if err != nil || l.Err() != nil {
			t.Fatalf("G2's Lease = %v, %v", l, err)
		}
		if err := s.Release(ctx, 1); err != nil { // G2
			t.Fatalf("G2's Release = %v", err)
		}
		if ok, err := other.TryAcquire(ctx, 1); err != nil || !ok {
			t.Fatalf("TryAcquire after both Releases = %v, %v; want true", ok, err)
		}
		if err := other.Release(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, 1); !errors.Is(err, dsync.ErrNotHeld) {
			t.Fatalf("a third Release = %v, want ErrNotHeld", err)
		}
	})
}

// Goroutines sharing a Semaphore handle without an owner, with no loss:
// one's Release may end the holding while another's Acquire starts a new
// one, and the replies may come back in either order. No permit is taken
// for a lost one: every Release succeeds and nothing is left held.
func TestSemaphoreHandleSharedWithoutLoss(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		s := newClient(t, b).Semaphore(name, 2)
		const goroutines, rounds = 3, 60
		errs := make(chan error, goroutines*rounds)
		var wg sync.WaitGroup
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					if err := s.Acquire(ctx, 1); err != nil {
						errs <- err
						return
					}
					if err := s.Release(ctx, 1); err != nil {
						errs <- fmt.Errorf("Release: %w", err)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		other := newClient(t, b).Semaphore(name, 2)
		if ok, err := other.TryAcquire(ctx, 2); err != nil || !ok {
			t.Fatalf("TryAcquire(2) after every Release = %v, %v; want true", ok, err)
		}
		if err := other.Release(ctx, 2); err != nil {
			t.Fatal(err)
		}
	})
}

// A PUBLISH that names a waiting call, without the proof only the script
// has, wakes the waiter but grants it nothing.
func TestForgedHandoverGrantsNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		rdb := b.NewClient(t)
		holder := newClient(t, b).Mutex(name)
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		hl, err := holder.Lease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waiter := newClient(t, b).Mutex(name)
		done := make(chan error, 1)
		go func() { done <- waiter.Lock(ctx) }()
		// The waiter's queue place: waiter token -> "<deadline> <ttl>
		// <call id> ...".
		var tok, cid string
		waitFor(t, 5*time.Second, "the waiter's queue place", func() bool {
			m, _ := rdb.HGetAll(ctx, mutexKeys(name).QueueData).Result()
			for f, v := range m {
				if fs := strings.Fields(v); len(fs) >= 3 {
					tok, cid = f, fs[2]
					return true
				}
			}
			return false
		})
		for _, p := range []string{
			tok + " 424242",
			cid + " " + sha1hex(tok) + " 424242 " + sha1hex("guess 424242"),
			cid + " " + sha1hex(tok) + " 9223372036854775808 x",
			cid + " 424242",
		} {
			if err := rdb.Publish(ctx, mutexKeys(name).Channel(), p).Err(); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case err := <-done:
			t.Fatalf("Lock returned %v after forged hand-overs while another holds", err)
		case <-time.After(300 * time.Millisecond):
		}
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		l, err := waiter.Lease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= hl.Token() || l.Token() == 424242 {
			t.Fatalf("token after the real hand-over = %d, want above the holder's %d", l.Token(), hl.Token())
		}
		if err := waiter.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// Two goroutines of one owner that wait for a Mutex both get in when it is
// released, as two levels of one hold: the first Unlock leaves it held.
func TestOwnerWaitingInTwoGoroutinesCountsTwice(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		holder := newClient(t, b).Mutex(name)
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		octx := dsync.WithOwner(ctx)
		m := newClient(t, b).Mutex(name)
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- m.Lock(octx)
			}()
		}
		rdb := b.NewClient(t)
		waitFor(t, 5*time.Second, "a queue place", func() bool {
			n, _ := rdb.Exists(ctx, mutexKeys(name).QueueData).Result()
			return n == 1
		})
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if v := holderField(t, rdb, mutexKeys(name).Lock, dsync.OwnerToken(octx)); v != "2" {
			t.Fatalf("count in Redis = %q, want 2", v)
		}
		if err := m.Unlock(octx); err != nil {
			t.Fatal(err)
		}
		if ok, err := newClient(t, b).Mutex(name).TryLock(ctx); ok || err != nil {
			t.Fatalf("TryLock by another after one of two Unlocks = %v, %v; want false", ok, err)
		}
		if err := m.Unlock(octx); err != nil {
			t.Fatal(err)
		}
		if ok, err := newClient(t, b).Mutex(name).TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock by another after both Unlocks = %v, %v; want true", ok, err)
		}
	})
}
