package dsync_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// Under client reentrancy, an owner's Unlock that finds the last release
// of its hold under way (held by a server that does not answer) returns
// when its ctx ends, as every call does (DESIGN: Deadlines): the owner's
// hold was lost with two levels, the first Unlock releases it in Redis
// (stuck), the second, for the other level, must not wait for it past
// its deadline.
func TestClientReentrancyUnlockBehindAStuckReleaseKeepsDeadline(t *testing.T) {
	kinds := []struct {
		name, unlock string
		hold         holdKind
		keys         func(name string) []string
	}{
		{"Mutex", "mutex_unlock", mutexHold, func(n string) []string { return []string{mutexKeys(n).Lock} }},
		{"RWMutex.Lock", "rwmutex_unlock", writeHold, func(n string) []string { return []string{rwKeys(n).Writer} }},
		{"RWMutex.RLock", "rwmutex_unlock", readHold, func(n string) []string { return []string{rwKeys(n).Readers, rwKeys(n).ReaderData} }},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			eachOwnerName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				gate := &unlockGate{sha: lua.Script(k.unlock).Hash()}
				c, rdb := hookedClient(t, b, gate, dsync.ClientReentrancy(), dsync.RenewEvery(20*time.Millisecond))
				h := k.hold(c, name)
				// The scripts loaded.
				must(t, h.lock(ctx))
				must(t, h.unlock(ctx))
				must(t, h.lock(ctx))
				must(t, h.lock(ctx)) // two levels, in the process
				lease, err := h.lease(ctx)
				must(t, err)
				must(t, rdb.Del(ctx, k.keys(name)...).Err())
				select {
				case <-lease.Done():
				case <-time.After(10 * time.Second):
					t.Fatal("the loss of the deleted hold was not reported")
				}
				gate.close()
				defer gate.open()
				actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
				first := async(func() error { return h.unlock(actx) })
				waitFor(t, 10*time.Second, "the first Unlock's release sent", func() bool { return gate.held.Load() == 1 })
				bctx, cancel2 := context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel2()
				start := time.Now()
				second := async(func() error { return h.unlock(bctx) })
				select {
				case err := <-second:
					if d := time.Since(start); d > 200*time.Millisecond+time.Second {
						t.Fatalf("second Unlock returned %v after %v, past its deadline (200ms)", err, d)
					}
					checkIs(t, err, context.DeadlineExceeded, "second Unlock behind the stuck release = %v, want DeadlineExceeded")
				case <-time.After(200*time.Millisecond + 2*time.Second):
					t.Fatal("second Unlock still blocked 2s past its deadline behind the stuck release")
				}
				mustIs(t, <-first, context.DeadlineExceeded, "first Unlock, stuck = %v, want DeadlineExceeded")
				gate.open()
				dsync.WaitCleanups(c)
				// Both releases done in the background: another Client
				// takes the name (all of it) at once.
				ok, err := newClient(t, b).RWMutex(name).TryLock(ctx)
				if k.name == "Mutex" {
					ok, err = newClient(t, b).Mutex(name).TryLock(ctx)
				}
				if err != nil || !ok {
					t.Fatalf("another Client after both Unlocks: %v, %v; want the name", ok, err)
				}
			})
		})
	}
}

// Many goroutines of one owner wait, in both reentrancy modes, and give
// up (their deadlines end) while the hold they wait for is released:
// hand-overs to the owner's shared place race with cancellations. Those
// that got the hold give it back; what is left is nothing.
func TestSharedOwnerCancelLeavesNothing(t *testing.T) {
	for _, op := range contractOps() {
		if op.try || op.p.ownerless {
			continue
		}
		t.Run(op.name, func(t *testing.T) {
			for _, mode := range []struct {
				name string
				opts []dsync.Option
			}{{"script", nil}, {"client", []dsync.Option{dsync.ClientReentrancy()}}} {
				t.Run(mode.name, func(t *testing.T) {
					eachEnv(t, onBackendsQuorum, op.p.quorum, func(t *testing.T, e contractEnv) {
						ctx, name := ctxT(t), redistest.Key(t)
						p := op.p
						for round := 0; round < 3; round++ {
							end := p.holdOn(t, ctx, e, name)
							c := e.over(t, e.connect(t), mode.opts...)
							octx := dsync.WithOwner(ctx)
							cancelRace(t, op, c, octx, name, 12, end, func(_ int, wctx context.Context) context.Context { return wctx })
							p.leftNothing(t, ctx, e, name, "after the owner's waiters gave up")
							if t.Failed() {
								return
							}
						}
					})
				})
			}
		})
	}
}

// Many goroutines share one handle without an owner (a Semaphore's
// holding, an RWMutex's read holds) and give up (their deadlines end)
// while what they wait for is released: hand-overs into the handle's
// holding race with cancellations. Those that got permits (a read hold)
// give them back through the handle; what is left is nothing, and no
// Release reports a loss.
func TestSharedHandleCancelLeavesNothing(t *testing.T) {
	const size = 3
	kinds := []struct {
		name string
		// handle returns the calls of one handle of c: take n (waiting),
		// give n back.
		handle func(c *dsync.Client, name string) (take, give func(ctx context.Context, n int64) error)
		// hold takes all of name through c; free reports whether c takes
		// all of it at once (and gives it back).
		hold func(ctx context.Context, c *dsync.Client, name string) (end func() error, err error)
		free func(ctx context.Context, c *dsync.Client, name string) (bool, error)
	}{
		{"Semaphore", func(c *dsync.Client, name string) (func(context.Context, int64) error, func(context.Context, int64) error) {
			s := c.Semaphore(name, size)
			return s.Acquire, s.Release
		}, func(ctx context.Context, c *dsync.Client, name string) (func() error, error) {
			s := c.Semaphore(name, size)
			return func() error { return s.Release(ctx, size) }, s.Acquire(ctx, size)
		}, func(ctx context.Context, c *dsync.Client, name string) (bool, error) {
			s := c.Semaphore(name, size)
			ok, err := s.TryAcquire(ctx, size)
			if ok {
				err = s.Release(ctx, size)
			}
			return ok, err
		}},
		{"RWMutex.RLock", func(c *dsync.Client, name string) (func(context.Context, int64) error, func(context.Context, int64) error) {
			rw := c.RWMutex(name)
			return func(ctx context.Context, _ int64) error { return rw.RLock(ctx) }, func(ctx context.Context, _ int64) error { return rw.RUnlock(ctx) }
		}, func(ctx context.Context, c *dsync.Client, name string) (func() error, error) {
			rw := c.RWMutex(name)
			return func() error { return rw.Unlock(ctx) }, rw.Lock(ctx)
		}, func(ctx context.Context, c *dsync.Client, name string) (bool, error) {
			rw := c.RWMutex(name)
			ok, err := rw.TryLock(ctx)
			if ok {
				err = rw.Unlock(ctx)
			}
			return ok, err
		}},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				for round := 0; round < 3; round++ {
					end, err := k.hold(ctx, newClient(t, b), name)
					must(t, err)
					c := newClient(t, b)
					take, give := k.handle(c, name)
					var wg sync.WaitGroup
					for i := 0; i < 12; i++ {
						wg.Add(1)
						go func() {
							defer wg.Done()
							n := int64(1 + i%2)
							wctx, cancel := context.WithTimeout(ctx, time.Duration(1+rand.IntN(40))*time.Millisecond)
							defer cancel()
							if err := take(wctx, n); err != nil {
								if !errors.Is(err, context.DeadlineExceeded) {
									t.Errorf("take %d = %v, want DeadlineExceeded", n, err)
								}
								return
							}
							if err := give(ctx, n); err != nil {
								t.Errorf("give %d back: %v", n, err)
							}
						}()
					}
					time.Sleep(20 * time.Millisecond)
					must(t, end())
					wg.Wait()
					dsync.WaitCleanups(c)
					ok, err := k.free(ctx, newClient(t, b), name)
					if err != nil || !ok {
						t.Fatalf("round %d: another Client after every waiter gave up or gave back: %v, %v; want all of it", round, ok, err)
					}
				}
			})
		})
	}
}
