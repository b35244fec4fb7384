package dsync_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// muted returns the source of script name with every PUBLISH sent to a
// channel nobody listens on: releases and hand-overs still happen, but no
// waiter hears of them.
func muted(t *testing.T, name string) string {
	t.Helper()
	// mutate fails the test if the script publishes some other way.
	return mutate(t, name, "redis.call('PUBLISH', ch,", "redis.call('PUBLISH', ch .. ':muted',")
}

// handoverSide is one holder of a primitive whose release hands the hold
// over to the first waiter: a Mutex, an RWMutex writer, a Semaphore of one
// permit.
type handoverSide struct {
	lock   func(ctx context.Context) error
	unlock func(ctx context.Context) error
	lease  func(ctx context.Context) (*dsync.Lease, error)
}

// A handoverCase is a primitive whose release hands over: its unlock
// script, its hold's key and channel, and how to make a holder.
type handoverCase struct {
	name, script string
	key          func(name string) string
	channel      func(name string) string
	make         func(c *dsync.Client, name string, ttl time.Duration) handoverSide
}

// eachHandoverCase runs f for each handoverCase as eachName does, skipping
// miniredis for the reason noMini.
func eachHandoverCase(t *testing.T, noMini string, f func(t *testing.T, tc handoverCase, b redistest.Backend, ctx context.Context, name string)) {
	for _, tc := range handoverCases {
		t.Run(tc.name, func(t *testing.T) {
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				if b.Mini != nil {
					t.Skip(noMini)
				}
				f(t, tc, b, ctx, name)
			})
		})
	}
}

var handoverCases = []handoverCase{
	{"Mutex", "mutex_unlock", func(n string) string { return mutexKeys(n).Lock },
		func(n string) string { return mutexKeys(n).Channel() },
		func(c *dsync.Client, n string, ttl time.Duration) handoverSide {
			m := c.Mutex(n, dsync.TTL(ttl))
			return handoverSide{m.Lock, m.Unlock, m.Lease}
		}},
	{"RWMutex", "rwmutex_unlock", func(n string) string { return rwk(n).Writer },
		func(n string) string { return rwk(n).Channel() },
		func(c *dsync.Client, n string, ttl time.Duration) handoverSide {
			rw := c.RWMutex(n, dsync.TTL(ttl))
			return handoverSide{rw.Lock, rw.Unlock, rw.Lease}
		}},
	{"Semaphore", "semaphore_release", nil,
		func(n string) string { return semKeys(n).Channel() },
		func(c *dsync.Client, n string, ttl time.Duration) handoverSide {
			s := c.Semaphore(n, 1, dsync.TTL(ttl))
			return handoverSide{
				func(ctx context.Context) error { return s.Acquire(ctx, 1) },
				func(ctx context.Context) error { return s.Release(ctx, 1) },
				s.Lease,
			}
		}},
}

// A waiter that misses the notification of a hand-over learns of it from
// its next attempt. The server's TTL of the hold started at the hand-over,
// before that attempt, so the lease must be measured from the attempt sent
// before the hand-over: the waiter's local deadline is never later than
// the server's expiry of its hold (DESIGN, Leases). Measured from the later
// attempt, it would be late by the time the waiter slept (up to a TTL), and
// another process could get in while the waiter's lease still looked live.
func TestLeaseStartAfterMissedHandover(t *testing.T) {
	eachHandoverCase(t, "miniredis TTLs move only when told: its expiry says nothing about a local deadline", func(t *testing.T, tc handoverCase, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		// The first holder's lease is short, so that the waiter's
		// next attempt comes within about a second; the waiter's is
		// long, so that its hold is still there when it learns of it.
		first := tc.make(newClient(t, b), name, time.Second)
		wc := newClient(t, b)
		stall := make(chan struct{})
		t.Cleanup(func() { close(stall) })
		// No renewal of the waiter's hold goes out during the test:
		// its deadline stays the one its lease started with.
		dsync.SetRenewStall(wc, func() { <-stall })
		waiter := tc.make(wc, name, 3*time.Second)

		must(t, first.lock(ctx))
		restore := dsync.SwapScript(tc.script, muted(t, tc.script))
		defer restore()
		got := make(chan error, 1)
		go func() { got <- waiter.lock(ctx) }()
		// Let the waiter make its first attempt and queue.
		time.Sleep(300 * time.Millisecond)
		must(t, first.unlock(ctx))
		handover := time.Now()
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		learned := time.Since(handover)
		restore()
		l, err := waiter.lease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sent := time.Now()
		var pttl time.Duration
		if tc.key != nil {
			pttl, err = rdb.PTTL(ctx, tc.key(name)).Result()
		} else {
			pttl, err = semHolderTTL(ctx, rdb, name)
		}
		if err != nil || pttl <= 0 {
			t.Fatalf("PTTL of the waiter's hold = %v, %v", pttl, err)
		}
		// The server expires the hold at the earliest at sent+pttl.
		if d, expiry := dsync.LeaseDeadline(l), sent.Add(pttl); d.After(expiry) {
			t.Fatalf("hand-over learned %v after it happened: local deadline %v after the server's expiry",
				learned.Round(time.Millisecond), d.Sub(expiry).Round(time.Millisecond))
		}
		if learned < 100*time.Millisecond {
			t.Fatalf("the waiter learned of the hand-over %v after it: it was not missed", learned)
		}
		must(t, waiter.unlock(ctx))
	})
}

// semHolderTTL returns how long the server keeps the only holding of the
// Semaphore name: its deadline in the holders zset less the server's time.
func semHolderTTL(ctx context.Context, rdb redis.UniversalClient, name string) (time.Duration, error) {
	hs, err := rdb.ZRangeWithScores(ctx, semKeys(name).Holders, 0, -1).Result()
	if err != nil {
		return 0, err
	}
	if len(hs) != 1 {
		return 0, fmt.Errorf("holders %v, want one", hs)
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	return time.Duration(int64(hs[0].Score)-now.UnixMilli()) * time.Millisecond, nil
}

// scriptGate holds back the script calls of one go-redis client while it is
// shut, and counts those that completed. With pipes, it holds back
// pipelines that hold a script call too (a Client coalesces calls made
// together into one, see batch.go).
type scriptGate struct {
	mu    sync.Mutex
	shut  chan struct{} // nil while open
	done  atomic.Int64
	pipes bool
	last  time.Time // when the last script call (or pipeline) went on
}

// lastCall returns when the last script call (or pipeline, with pipes)
// that the gate let through went on.
func (g *scriptGate) lastCall() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.last
}

// pass waits while the gate is shut, or until ctx ends.
func (g *scriptGate) pass(ctx context.Context) error {
	g.mu.Lock()
	shut := g.shut
	g.mu.Unlock()
	if shut != nil {
		select {
		case <-shut:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	g.mu.Lock()
	g.last = time.Now()
	g.mu.Unlock()
	return nil
}

func (g *scriptGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut == nil {
		g.shut = make(chan struct{})
	}
}

func (g *scriptGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
}

func (g *scriptGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *scriptGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n != "evalsha" && n != "eval" {
			return next(ctx, cmd)
		}
		if err := g.pass(ctx); err != nil {
			return err
		}
		err := next(ctx, cmd)
		g.done.Add(1)
		return err
	}
}

func (g *scriptGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	if !g.pipes {
		return next
	}
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if isScriptCmd(cmd) {
				if err := g.pass(ctx); err != nil {
					return err
				}
				break
			}
		}
		return next(ctx, cmds)
	}
}

// A hand-over notification can reach the waiter after the hold it gave has
// ended: the waiter did not know it held, nobody renewed, and another
// holder got in. A notification that late must grant nothing (DESIGN,
// Waiting: never two holders). The waiter is W, with a lease of one
// second. A releases to W while W's notifications are held back and its
// attempts are shut out; W's hold runs out and B takes the name; W's next
// attempt is refused; only then does the hand-over message arrive. W must
// not return from its lock while B holds, and it gets the name after B.
func TestLateHandoverAfterTheHoldEndedGrantsNothing(t *testing.T) {
	eachHandoverCase(t, "miniredis expires nothing while the test sleeps; the engine's rule is the same on every backend", func(t *testing.T, tc handoverCase, b redistest.Backend, ctx context.Context, name string) {
		const ttl = time.Second
		rdb := b.NewClient(t)
		a := tc.make(newClient(t, b), name, ttl)
		bside := tc.make(newClient(t, b), name, 30*time.Second)

		wrdb := b.NewClient(t)
		gate := &scriptGate{}
		wrdb.AddHook(gate)
		wc := dsync.New(wrdb)
		t.Cleanup(func() { wc.Close() })
		// The receiving goroutine blocks on a hand-over message
		// until let is closed; probes go by.
		let := make(chan struct{})
		var letOnce sync.Once
		release := func() { letOnce.Do(func() { close(let) }) }
		t.Cleanup(release) // before wc.Close
		var probed, held atomic.Int64
		dsync.SetMessageHook(wc, func(_, payload string) {
			switch payload {
			case "probe":
				probed.Add(1)
			case "":
			default:
				held.Add(1)
				<-let
			}
		})
		w := tc.make(wc, name, ttl)

		must(t, a.lock(ctx))
		got := make(chan error, 1)
		go func() { got <- w.lock(ctx) }()
		// W's first attempt is refused and queues; W subscribes.
		waitFor(t, 10*time.Second, "first attempt by the waiter", func() bool { return gate.done.Load() >= 1 })
		ch := tc.channel(name)
		waitFor(t, 10*time.Second, "subscription of the waiter", func() bool {
			rdb.Publish(ctx, ch, "probe")
			return probed.Load() > 0
		})
		gate.close()
		must(t, a.unlock(ctx))
		waitFor(t, 10*time.Second, "hand-over message to the waiter", func() bool { return held.Load() > 0 })
		// W holds in Redis without knowing it. Its hold runs out
		// (nobody renews it); B waits for that and gets in.
		must(t, bside.lock(ctx))
		bl, err := bside.lease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// W's next attempt comes back refused, a TTL and more
		// after its first.
		before := gate.done.Load()
		gate.open()
		waitFor(t, 10*time.Second, "refused attempt by the waiter", func() bool { return gate.done.Load() > before })
		select {
		case err := <-got:
			t.Fatalf("W's lock returned %v while B holds, before the late message came", err)
		default:
		}
		// The late hand-over message arrives.
		after := gate.done.Load()
		release()
		waitFor(t, 10*time.Second, "attempt by the waiter after the late message", func() bool {
			select {
			case err := <-got:
				t.Fatalf("W's lock returned %v on a hand-over of a hold that had ended; B holds", err)
			default:
			}
			return gate.done.Load() > after
		})
		time.Sleep(100 * time.Millisecond)
		select {
		case err := <-got:
			t.Fatalf("W's lock returned %v while B holds", err)
		default:
		}
		if err := bl.Err(); err != nil {
			t.Fatalf("B's lease: %v", err)
		}
		must(t, bside.unlock(ctx))
		recvNil(t, got, 15*time.Second, "W did not get the name after B released it")
		wl, err := w.lease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if wl.Token() <= bl.Token() {
			t.Errorf("W's fencing token %d is not above B's %d", wl.Token(), bl.Token())
		}
		must(t, w.unlock(ctx))
	})
}
