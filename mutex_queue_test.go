package dsync_test

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A locker is what the queue tests need of a Mutex or an RWMutex's write
// lock.
type locker interface {
	Lock(ctx context.Context) error
	TryLock(ctx context.Context) (bool, error)
	Unlock(ctx context.Context) error
}

// TestTryLockTakesNoQueuePlace checks that a TryLock that fails while
// waiters are queued leaves no place behind: a place would later be handed
// the lock with nobody there to use it, blocking the name for a TTL.
func TestTryLockTakesNoQueuePlace(t *testing.T) {
	for _, kind := range []struct {
		name  string
		queue func(name string) string // the key of the queue zset
		open  func(c *dsync.Client, name string) locker
	}{
		{"Mutex", func(name string) string { return mutexKeys(name).Queue }, func(c *dsync.Client, name string) locker { return c.Mutex(name) }},
		{"RWMutex", func(name string) string { return rwk(name).WriterQueue }, func(c *dsync.Client, name string) locker { return c.RWMutex(name) }},
	} {
		t.Run(kind.name, func(t *testing.T) {
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				rdb := b.NewClient(t)
				places := func() int64 {
					n, err := rdb.ZCard(ctx, kind.queue(name)).Result()
					if err != nil {
						t.Fatal(err)
					}
					return n
				}
				holder := kind.open(newClient(t, b), name)
				must(t, holder.Lock(ctx))
				waiter := kind.open(newClient(t, b), name)
				got := make(chan error, 1)
				go func() { got <- waiter.Lock(ctx) }()
				waitFor(t, 5*time.Second, "the waiter's queue place", func() bool { return places() == 1 })

				if ok, err := kind.open(newClient(t, b), name).TryLock(ctx); ok || err != nil {
					t.Fatalf("TryLock = %v, %v; want false, nil", ok, err)
				}
				if n := places(); n != 1 {
					t.Fatalf("after a failed TryLock the queue has %d places, want 1", n)
				}
				must(t, holder.Unlock(ctx))
				if err := <-got; err != nil {
					t.Fatal(err)
				}
				must(t, waiter.Unlock(ctx))
				// The name is free now: nothing was handed to the TryLock caller.
				if ok, err := kind.open(newClient(t, b), name).TryLock(ctx); !ok || err != nil {
					t.Fatalf("TryLock after the queue drained = %v, %v; want true, nil", ok, err)
				}
			})
		})
	}
}

// contend runs one goroutine per locker, each locking and at once
// unlocking for d, and returns the fewest and most acquisitions of a
// goroutine and how many times two held the lock at once.
func contend(t *testing.T, ctx context.Context, lockers []locker, d time.Duration) (lo, hi, overlaps int64) {
	t.Helper()
	counts := make([]atomic.Int64, len(lockers))
	var inside, bad atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			untilClosed(stop, 100000, func() bool {
				if err := l.Lock(ctx); err != nil {
					t.Error(err)
					return false
				}
				if inside.Add(1) != 1 {
					bad.Add(1)
				}
				counts[g].Add(1)
				inside.Add(-1)
				if err := l.Unlock(ctx); err != nil {
					t.Error(err)
					return false
				}
				return true
			})
		}()
	}
	time.Sleep(d)
	close(stop)
	wg.Wait()
	lo, hi = 1<<62, 0
	for g := range counts {
		n := counts[g].Load()
		lo, hi = min(lo, n), max(hi, n)
	}
	return lo, hi, bad.Load()
}

// TestMutexWaiterNotStalledByHandOvers checks that a waiter that found the
// lock held is served in turn even while every release hands the lock on
// to a queued waiter (no plain release ever wakes it): it must not sleep
// until its timer, which with the default 30 s TTL is many seconds.
func TestMutexWaiterNotStalledByHandOvers(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		first := c.Mutex(name)
		must(t, first.Lock(ctx))
		// Late arrives while there is no queue.
		late := newClient(t, b).Mutex(name)
		lateDone := make(chan time.Time, 1)
		go func() {
			if err := late.Lock(ctx); err != nil {
				t.Error(err)
			}
			lateDone <- time.Now()
			_ = late.Unlock(ctx)
		}()
		time.Sleep(20 * time.Millisecond)
		// Others keep the lock busy by hand-over for a while.
		others := make([]*dsync.Mutex, 3)
		for i := range others {
			others[i] = newClient(t, b).Mutex(name)
		}
		stop := time.Now().Add(1500 * time.Millisecond)
		done := make(chan struct{})
		for _, m := range others {
			go func() {
				defer func() { done <- struct{}{} }()
				for time.Now().Before(stop) {
					if err := m.Lock(ctx); err != nil {
						t.Error(err)
						return
					}
					time.Sleep(time.Millisecond)
					if err := m.Unlock(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		time.Sleep(20 * time.Millisecond)
		released := time.Now()
		must(t, first.Unlock(ctx))
		var at time.Time
		select {
		case at = <-lateDone:
		case <-time.After(10 * time.Second):
			t.Fatal("the late waiter did not get the lock within 10 s")
		}
		for range others {
			<-done
		}
		// Three other goroutines hold it ~1 ms each, so a turn comes within
		// a few ms; 1 s leaves room for a slow machine.
		if d := at.Sub(released); d > time.Second {
			t.Errorf("the late waiter got the lock %v after the release, want under 1s", d)
		}
	})
}

// A queueKind is a hold whose waiters queue in Redis in arrival order:
// its queue zset and its calls.
type queueKind struct {
	name  string
	queue func(name string) string
	kind  holdKind
}

func queueKinds() []queueKind {
	return []queueKind{
		{"Mutex", func(n string) string { return mutexKeys(n).Queue }, mutexHold},
		{"RWMutex", func(n string) string { return rwk(n).WriterQueue }, writeHold},
	}
}

// servedInOrder checks, once the holder released, that the waiter that
// queued first (its Lock's result on firstIn) gets the lock, and the second
// (secondIn) only after the first releases it (releaseFirst).
func servedInOrder(t *testing.T, firstIn, secondIn <-chan error, releaseFirst func() error) {
	t.Helper()
	select {
	case err := <-firstIn:
		must(t, err)
	case err := <-secondIn:
		t.Fatalf("the waiter that queued second got the lock first (%v)", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no waiter got the lock after the release")
	}
	select {
	case err := <-secondIn:
		t.Fatalf("the second waiter got the lock while the first holds it (%v)", err)
	default:
	}
	must(t, releaseFirst())
	recvNil(t, secondIn, 10*time.Second, "the second waiter after the first's release")
}

// Waiters are served in the order they queued also when the server's
// clock steps back between their arrivals: the one that queued first gets
// the lock when the holder releases it, the later one after it. (On
// miniredis, whose clock the test moves.)
func TestQueueOrderHoldsWhenTheServerClockStepsBack(t *testing.T) {
	for _, k := range queueKinds() {
		t.Run(k.name, func(t *testing.T) {
			b := redistest.Miniredis(t)
			b.Advance(0) // the server's clock stands still from here
			ctx, name := ctxT(t), redistest.Key(t)
			rdb := b.NewClient(t)
			queued := func(n int64) func() bool {
				return func() bool {
					got, err := rdb.ZCard(ctx, k.queue(name)).Result()
					return err == nil && got == n
				}
			}
			holder := k.kind(newClient(t, b), name)
			first, second := k.kind(newClient(t, b), name), k.kind(newClient(t, b), name)
			must(t, holder.lock(ctx))
			firstIn := async(func() error { return first.lock(ctx) })
			waitFor(t, 10*time.Second, "the first waiter queued", queued(1))
			b.Advance(-5 * time.Second)
			secondIn := async(func() error { return second.lock(ctx) })
			waitFor(t, 10*time.Second, "the second waiter queued", queued(2))
			must(t, holder.unlock(ctx))
			servedInOrder(t, firstIn, secondIn, func() error { return first.unlock(ctx) })
			must(t, second.unlock(ctx))
		})
	}
}

// A foreign member at the tail of a queue (a score of +inf, which no
// arrival has) does not decide the order of later arrivals: were they
// scored past it, they would all tie at +inf and be served by member
// order. Here the waiter that queues first has the token that sorts last.
func TestQueueOrderHoldsPastAForeignTail(t *testing.T) {
	for _, k := range queueKinds() {
		t.Run(k.name, func(t *testing.T) {
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				rdb := b.NewClient(t)
				q := k.queue(name)
				holder := k.kind(newClient(t, b), name)
				must(t, holder.lock(ctx))
				must(t, rdb.ZAdd(ctx, q, redis.Z{Score: math.Inf(1), Member: "foreign"}).Err())
				must(t, rdb.PExpire(ctx, q, time.Minute).Err())
				first, second := k.kind(newClient(t, b), name), k.kind(newClient(t, b), name)
				firstCtx := dsync.WithOwnerToken(ctx, "zzzz-first")
				secondCtx := dsync.WithOwnerToken(ctx, "aaaa-second")
				queued := func(tok string) func() bool {
					return func() bool {
						_, err := rdb.ZScore(ctx, q, tok).Result()
						return err == nil
					}
				}
				firstIn := async(func() error { return first.lock(firstCtx) })
				waitFor(t, 10*time.Second, "the first waiter queued", queued("zzzz-first"))
				secondIn := async(func() error { return second.lock(secondCtx) })
				waitFor(t, 10*time.Second, "the second waiter queued", queued("aaaa-second"))
				must(t, holder.unlock(ctx))
				servedInOrder(t, firstIn, secondIn, func() error { return first.unlock(firstCtx) })
				must(t, second.unlock(secondCtx))
			})
		})
	}
}

// A refused TryLock leaves no trace in the hold: not the mark that someone
// waits (':w'), which would make the holder's Unlock look for a queue head
// and notify every waiter of the name, and count the in-process passes of
// its cohort as if others waited in Redis. A refused Lock sets it.
func TestRefusedTryLockLeavesNoWaitMark(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		a, o := newClient(t, b).Mutex(name), newClient(t, b).Mutex(name)
		must(t, a.Lock(ctx))
		rdb := b.NewClient(t)
		ok, err := o.TryLock(ctx)
		must(t, err)
		if ok {
			t.Fatal("TryLock took a held lock")
		}
		if w, _ := rdb.HExists(ctx, mutexKeys(name).Lock, ":w").Result(); w {
			t.Errorf("a refused TryLock set ':w' on the holder's hash")
		}
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		if err := o.Lock(wctx); err == nil {
			t.Fatal("Lock took a held lock")
		}
		if w, _ := rdb.HExists(ctx, mutexKeys(name).Lock, ":w").Result(); !w {
			t.Errorf("a refused Lock did not set ':w' on the holder's hash")
		}
		must(t, a.Unlock(ctx))
	})
}
