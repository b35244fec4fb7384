package dsync_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// exclusive is a hold that excludes every other holder, in one primitive,
// for tests that run the same scenario over each.
type exclusive struct {
	name string
	// calls returns the calls of a handle of the primitive called n.
	calls func(c *dsync.Client, n string, opts ...dsync.Option) exclusiveCalls
	// queue returns the key of the zset where waiters of n take a place.
	queue func(n string) string
}

type exclusiveCalls struct {
	lock, unlock func(context.Context) error
	try          func(context.Context) (bool, error)
}

var exclusives = []exclusive{
	{"Mutex", func(c *dsync.Client, n string, opts ...dsync.Option) exclusiveCalls {
		m := c.Mutex(n, opts...)
		return exclusiveCalls{m.Lock, m.Unlock, m.TryLock}
	}, func(n string) string { return mutexKeys(n).Queue }},
	{"RWMutex", func(c *dsync.Client, n string, opts ...dsync.Option) exclusiveCalls {
		rw := c.RWMutex(n, opts...)
		return exclusiveCalls{rw.Lock, rw.Unlock, rw.TryLock}
	}, func(n string) string { return rwk(n).WaitingWriters }},
	{"Semaphore", func(c *dsync.Client, n string, opts ...dsync.Option) exclusiveCalls {
		s := c.Semaphore(n, 1, opts...)
		return exclusiveCalls{
			func(ctx context.Context) error { return s.Acquire(ctx, 1) },
			func(ctx context.Context) error { return s.Release(ctx, 1) },
			func(ctx context.Context) (bool, error) { return s.TryAcquire(ctx, 1) },
		}
	}, func(n string) string { return semKeys(n).Queue }},
}

// TestDeadWaiterDelaysOthersByItsOwnTTL: a waiter that dies in its queue
// place (its process gone, its clean-up never sent) is handed the lock by
// the release, for its own TTL; nobody refreshes that hold or releases it.
// The others must get in once it runs out (DESIGN, Waiting: "a dead
// waiter's place expires"), not sleep on for the TTL of the hold they were
// refused by. Before, a Mutex or RWMutex newcomer refused by a 30 s hold
// slept those 30 s although the dead waiter's 1 s hold had ended: it was
// still waiting when its 10 s ctx ended. Needs TTLs that run down by
// themselves: real server and cluster only.
func TestDeadWaiterDelaysOthersByItsOwnTTL(t *testing.T) {
	const (
		deadTTL = time.Second
		within  = 10 * time.Second // the holder's TTL is 30 s
	)
	for _, p := range exclusives {
		t.Run(p.name, func(t *testing.T) {
			eachRealName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				rdb := b.NewClient(t)
				holder := p.calls(newClient(t, b), name)
				must(t, holder.lock(ctx))
				// The waiter's process dies once it has its place: every
				// command it would send from then on fails.
				drdb := b.NewClient(t)
				faults := &redistest.Faults{}
				drdb.AddHook(faults)
				dc := dsync.New(drdb)
				dead := p.calls(dc, name, dsync.TTL(deadTTL))
				dctx, cancel := context.WithCancel(ctx)
				got := make(chan error, 1)
				go func() { got <- dead.lock(dctx) }()
				waitFor(t, 10*time.Second, "the waiter's place", func() bool {
					n, _ := rdb.ZCard(ctx, p.queue(name)).Result()
					return n > 0
				})
				faults.FailNext(1<<30, nil)
				cancel()
				<-got
				// Closed at the end: Close would wait (5 s at most) for the
				// clean-up of the cancelled call, which fails on every try
				// here, and the dead waiter's place would lapse meanwhile.
				t.Cleanup(func() { dc.Close() })

				newcomer := p.calls(newClient(t, b), name)
				nctx, ncancel := context.WithTimeout(ctx, within)
				defer ncancel()
				ngot := make(chan error, 1)
				start := time.Now()
				go func() { ngot <- newcomer.lock(nctx) }()
				// The newcomer is refused by the holder's 30 s hold (or
				// queues behind the dead waiter) before the release.
				waitFor(t, 10*time.Second, "the newcomer's attempt", func() bool {
					n, _ := rdb.ZCard(ctx, p.queue(name)).Result()
					return n > 1
				})
				must(t, holder.unlock(ctx))
				if err := <-ngot; err != nil {
					t.Fatalf("newcomer after a dead waiter with a %v TTL = %v after %v; want the hold",
						deadTTL, err, time.Since(start).Round(time.Millisecond))
				}
				must(t, newcomer.unlock(ctx))
			})
		})
	}
}
