package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/internal/redistest"
)

// slowDial delays one dial, once armed.
type slowDial struct{ arm atomic.Bool }

func (h *slowDial) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if h.arm.CompareAndSwap(true, false) {
			time.Sleep(2500 * time.Millisecond) // past the wait for a subscription
		}
		return next(ctx, network, addr)
	}
}
func (h *slowDial) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *slowDial) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A waiter whose Client's pub/sub connection is slow to come up (its dial,
// or a handshake the server is slow to answer) still returns when its ctx
// ends: the subscription is made in the background (DESIGN, Deadlines).
func TestSlowSubscriptionKeepsDeadline(t *testing.T) {
	const wait, slack = 300 * time.Millisecond, 700 * time.Millisecond
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		holder := newClient(t, b)
		calls := map[string]func(c *dsync.Client, name string) (hold, call func(context.Context) error){
			"Mutex": func(c *dsync.Client, name string) (func(context.Context) error, func(context.Context) error) {
				return holder.Mutex(name).Lock, c.Mutex(name).Lock
			},
			"RWMutex": func(c *dsync.Client, name string) (func(context.Context) error, func(context.Context) error) {
				return holder.RWMutex(name).Lock, c.RWMutex(name).RLock
			},
			"Semaphore": func(c *dsync.Client, name string) (func(context.Context) error, func(context.Context) error) {
				acquire := func(s *dsync.Semaphore) func(context.Context) error {
					return func(ctx context.Context) error { return s.Acquire(ctx, 1) }
				}
				return acquire(holder.Semaphore(name, 1)), acquire(c.Semaphore(name, 1))
			},
		}
		for what, mk := range calls {
			t.Run(what, func(t *testing.T) {
				name := redistest.Key(t)
				rdb := b.NewClient(t)
				if err := rdb.Ping(ctx).Err(); err != nil { // the command connection
					t.Fatal(err)
				}
				slow := &slowDial{}
				rdb.AddHook(slow)
				c := dsync.New(rdb)
				defer c.Close()
				hold, call := mk(c, name)
				must(t, hold(ctx))
				slow.arm.Store(true) // the next dial is the pub/sub connection's
				cctx, cancel := context.WithTimeout(ctx, wait)
				defer cancel()
				start := time.Now()
				err := call(cctx)
				took := time.Since(start)
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s while held = %v, want DeadlineExceeded", what, err)
				}
				if took > wait+slack {
					t.Errorf("%s with a %v ctx returned after %v, want within %v", what, wait, took, wait+slack)
				}
			})
		}
	})
}

// TestSlowSubscriptionDoesNotSlowLaterWaits: the first SUBSCRIBE of a name
// fails (its connection is slow to come up); go-redis subscribes again once
// connected, and later waiters on the name must be woken at once again.
func TestSlowSubscriptionDoesNotSlowLaterWaits(t *testing.T) {
	b, ctx, name := realName(t)
	holder := newClient(t, b).Mutex(name)
	rdb := b.NewClient(t)
	if err := rdb.Ping(ctx).Err(); err != nil { // the command connection
		t.Fatal(err)
	}
	slow := &slowDial{}
	rdb.AddHook(slow)
	c := dsync.New(rdb)
	defer c.Close()
	slow.arm.Store(true) // the next dial is the pub/sub connection's
	for i := 0; i < 4; i++ {
		must(t, holder.Lock(ctx))
		released := make(chan struct{})
		go func() {
			defer close(released)
			time.Sleep(50 * time.Millisecond)
			_ = holder.Unlock(ctx)
		}()
		start := time.Now()
		m := c.Mutex(name)
		must(t, m.Lock(ctx))
		waited := time.Since(start)
		<-released
		t.Logf("wait %d: %v (released after 50ms)", i, waited.Round(time.Millisecond))
		if i > 0 && waited > time.Second {
			t.Errorf("wait %d took %v after the subscription came up, want about 50ms", i, waited)
		}
		must(t, m.Unlock(ctx))
	}
}

// TestWaiterSurvivesPubSubKill: the server drops the pub/sub connection
// while a waiter sleeps (CLIENT KILL); the notifier reconnects and
// subscribes again, and the release that follows still wakes the waiter at
// once, not after the 30 s TTL.
func TestWaiterSurvivesPubSubKill(t *testing.T) {
	b, ctx, name := realName(t)
	holder := newClient(t, b).Mutex(name)
	must(t, holder.Lock(ctx))
	m := newClient(t, b).Mutex(name)
	got := make(chan error, 1)
	go func() { got <- m.Lock(ctx) }()
	admin := b.NewClient(t)
	waitFor(t, 5*time.Second, "the waiter's subscription", func() bool {
		n, err := admin.PubSubNumSub(ctx, mutexKeys(name).Channel()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n[mutexKeys(name).Channel()] > 0
	})
	must(t, admin.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err())
	time.Sleep(200 * time.Millisecond) // the notifier reconnects meanwhile
	released := time.Now()
	must(t, holder.Unlock(ctx))
	gotLockSoon(t, got, released, 10*time.Second, 2*time.Second, "the release")
	must(t, m.Unlock(ctx))
}

// gotLockSoon checks that the waiter's Lock, whose error got delivers,
// returned nil within limit and, since at (the time of event), well under
// within.
func gotLockSoon(t *testing.T, got <-chan error, at time.Time, limit, within time.Duration, event string) {
	t.Helper()
	recvNil(t, got, limit, fmt.Sprintf("the waiter did not get the lock within %v of %s", limit, event))
	if d := time.Since(at); d > within {
		t.Errorf("the waiter got the lock %v after %s, want well under %v", d, event, within)
	}
}

// TestWaiterAfterServerRestart: the server restarts empty while a holder
// holds (default 30 s TTL) and a waiter waits. The hold is gone with the
// data, and the waiter must find that out soon after the server is back —
// the notifier reconnects, subscribes again and the waiter retries — not
// after the TTL.
func TestWaiterAfterServerRestart(t *testing.T) {
	srv := redistest.StartStandalone(t)
	ctx := ctxT(t)
	holder := dsync.New(srv.Client(t))
	defer holder.Close()
	c := dsync.New(srv.Client(t))
	defer c.Close()
	must(t, holder.Mutex("restart").Lock(ctx))
	m := c.Mutex("restart")
	got := make(chan error, 1)
	go func() { got <- m.Lock(ctx) }()
	time.Sleep(100 * time.Millisecond) // the waiter subscribes and sleeps
	srv.Restart()
	restarted := time.Now()
	gotLockSoon(t, got, restarted, 15*time.Second, 5*time.Second, "the restart")
	must(t, m.Unlock(ctx))
}

// A waiter's attempts are bounded whatever anyone publishes: a flood of
// release notifications on its channel (which anyone allowed to PUBLISH
// can send) gets it at most one attempt every 20 ms, not one per message
// (DESIGN, Remote state: no busy loop).
func TestNotificationFloodBoundsAttempts(t *testing.T) {
	const wait = 1500 * time.Millisecond
	// 20 ms apart, the waiter makes at most wait/20ms = 75 attempts; a
	// waiter that attempted once per message would make thousands.
	const most = int64(wait/(20*time.Millisecond)) + 15
	type prim struct {
		name string
		ch   func(name string) string
		// hold takes the name through c until release is closed.
		hold func(t *testing.T, ctx context.Context, c *dsync.Client, name string, release chan struct{})
		// wait waits for the name through c until ctx ends.
		wait func(ctx context.Context, c *dsync.Client, name string) error
	}
	prims := []prim{
		{"Mutex", func(n string) string { return keys.ForMutex("dsync", n).Channel() },
			func(t *testing.T, ctx context.Context, c *dsync.Client, n string, _ chan struct{}) {
				must(t, c.Mutex(n).Lock(ctx))
			},
			func(ctx context.Context, c *dsync.Client, n string) error { return c.Mutex(n).Lock(ctx) }},
		{"RWMutex", func(n string) string { return keys.ForRWMutex("dsync", n).Channel() },
			func(t *testing.T, ctx context.Context, c *dsync.Client, n string, _ chan struct{}) {
				must(t, c.RWMutex(n).Lock(ctx))
			},
			func(ctx context.Context, c *dsync.Client, n string) error { return c.RWMutex(n).RLock(ctx) }},
		{"Semaphore", func(n string) string { return keys.ForSemaphore("dsync", n).Channel() },
			func(t *testing.T, ctx context.Context, c *dsync.Client, n string, _ chan struct{}) {
				must(t, c.Semaphore(n, 1).Acquire(ctx, 1))
			},
			func(ctx context.Context, c *dsync.Client, n string) error { return c.Semaphore(n, 1).Acquire(ctx, 1) }},
		{"Once", func(n string) string { return keys.ForOnce("dsync", n).Channel() },
			func(t *testing.T, ctx context.Context, c *dsync.Client, n string, release chan struct{}) {
				running := make(chan struct{})
				go c.Once(n).Do(ctx, func(context.Context) error {
					close(running)
					<-release
					return nil
				})
				select {
				case <-running:
				case <-ctx.Done():
					t.Fatal("the first Do did not run f")
				}
			},
			func(ctx context.Context, c *dsync.Client, n string) error {
				return c.Once(n).Do(ctx, func(context.Context) error { return errors.New("ran while another run held") })
			}},
	}
	for _, p := range prims {
		t.Run(p.name, func(t *testing.T) {
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				release := make(chan struct{})
				defer close(release)
				p.hold(t, ctx, newClient(t, b), name, release)

				rdb := b.NewClient(t)
				var n redistest.Counter
				rdb.AddHook(&n)
				wc := dsync.New(rdb)
				t.Cleanup(func() { wc.Close() })

				pub := b.NewClient(t)
				stop := make(chan struct{})
				var sent atomic.Int64
				done := make(chan struct{})
				go func() {
					defer close(done)
					untilClosed(stop, 50000, func() bool {
						if pub.Publish(ctx, p.ch(name), "").Err() == nil {
							sent.Add(1)
						}
						return true
					})
				}()
				wctx, cancel := context.WithTimeout(ctx, wait)
				err := p.wait(wctx, wc, name)
				cancel()
				close(stop)
				<-done
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("waiter = %v, want DeadlineExceeded", err)
				}
				got := n.RoundTrips()
				t.Logf("%d notifications published, %d round trips of the waiter", sent.Load(), got)
				if sent.Load() < 2*most {
					t.Fatalf("only %d notifications published in %v: the flood did not happen", sent.Load(), wait)
				}
				if got > most {
					t.Fatalf("the waiter made %d round trips in %v under a flood of %d notifications, want at most %d",
						got, wait, sent.Load(), most)
				}
			})
		})
	}
}

// TestHandOverGoesToTheWaitersClient: a hand-over to a call without an
// owner is published on its Client's own channel of the name, so that
// another Client waiting on the name does not receive it; one to a call
// with an owner, whose holder may have calls waiting in other Clients too,
// goes on the name's channel, where they hear it.
func TestHandOverGoesToTheWaitersClient(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, owned := range []bool{false, true} {
			t.Run(fmt.Sprintf("owned=%v", owned), func(t *testing.T) {
				ctx := ctxT(t)
				name := redistest.Key(t)
				k := mutexKeys(name)
				rdb := b.NewClient(t)
				holder := newClient(t, b).Mutex(name)
				must(t, holder.Lock(ctx))
				var handovers [2]atomic.Int64
				var probed [2]sync.Map // channels a probe was heard on
				errs := make(chan error, 2)
				for i := range 2 {
					c := newClient(t, b)
					dsync.SetMessageHook(c, func(ch, payload string) {
						switch {
						case payload == "probe":
							probed[i].Store(ch, true)
						case strings.Count(payload, " ") == 3:
							handovers[i].Add(1)
						}
					})
					m := c.Mutex(name)
					lctx := ctx
					if owned {
						lctx = dsync.WithOwner(ctx)
					}
					go func() {
						err := m.Lock(lctx)
						if err == nil {
							err = m.Unlock(lctx)
						}
						errs <- err
					}()
					// Waiter i is queued i-th, and both its channels are
					// subscribed.
					waitFor(t, 10*time.Second, "the waiter's queue place", func() bool {
						n, err := rdb.ZCard(ctx, k.Queue).Result()
						return err == nil && n == int64(i+1)
					})
					chans := []string{k.Channel(), k.Channel() + dsync.Inbox(c)}
					waitFor(t, 10*time.Second, "the waiter's subscriptions", func() bool {
						heard := 0
						for _, ch := range chans {
							if _, ok := probed[i].Load(ch); ok {
								heard++
							} else {
								rdb.Publish(ctx, ch, "probe")
							}
						}
						return heard == len(chans)
					})
				}
				// The hold goes to waiter 0, then to waiter 1.
				must(t, holder.Unlock(ctx))
				for range 2 {
					if err := <-errs; err != nil {
						t.Fatal(err)
					}
				}
				// Owner-less calls: each Client hears its own hand-over
				// only. Owned calls: both go on the name's channel, so
				// Client 1, which waits until the second, hears both;
				// Client 0 may have left the channel before the second.
				for i := range handovers {
					got, lo, hi := handovers[i].Load(), int64(1), int64(1)
					if owned {
						lo, hi = int64(1+i), 2
					}
					if got < lo || got > hi {
						t.Errorf("Client %d received %d hand-overs, want %d to %d", i, got, lo, hi)
					}
				}
			})
		}
	})
}
