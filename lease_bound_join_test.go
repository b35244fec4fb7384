package dsync_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
)

// Re-entries and joins under a lease that is not to be extended past a
// bound: FixedLease (the hold lasts its TTL from the Lock that took it)
// and MaxHold (no renewal extends it past the bound). The hold must end in
// Redis when its Lease reports it lost, not a TTL after the last re-entry
// or join, or other owners stay shut out of a name whose holder was told
// it has lost it (see checkReentryKeepsTTL).

// maxHoldReentry is the MaxHold of these tests and reentryAfter when the
// re-entry or join comes: with TTL fixedReentryTTL (3 s) renewals stop
// by MaxHold (4 s), so the Lease reports lost by then, and a re-entry at
// 2.5 s that extended the hold would keep it in Redis until 5.5 s.
const (
	maxHoldReentry = 4 * time.Second
	reentryAfter   = 2500 * time.Millisecond
)

// leaseKind returns, for kind ("mutex", "write", "read" or "semaphore"),
// the lock and lease of name on c (a Semaphore of 2, one permit at a
// time) and another owner's try on other that succeeds only when the
// name is free (a Semaphore's: both permits).
func leaseKind(kind string, c, other *dsync.Client, name string) (lock func(context.Context) error,
	lease func(context.Context) (*dsync.Lease, error), try func(context.Context) (bool, error)) {
	switch kind {
	case "mutex":
		m := c.Mutex(name)
		return m.Lock, m.Lease, other.Mutex(name).TryLock
	case "write":
		rw := c.RWMutex(name)
		return rw.Lock, rw.Lease, other.RWMutex(name).TryLock
	case "read":
		rw := c.RWMutex(name)
		return rw.RLock, rw.RLease, other.RWMutex(name).TryLock
	}
	s := c.Semaphore(name, 2)
	return func(ctx context.Context) error { return s.Acquire(ctx, 1) }, s.Lease,
		func(ctx context.Context) (bool, error) { return other.Semaphore(name, 2).TryAcquire(ctx, 2) }
}

// TestMaxHoldReentryKeepsTTL: with MaxHold, a re-entry of a Mutex or of
// either mode of an RWMutex does not extend the hold in Redis past the
// deadline its Lease keeps, in both reentrancy modes.
func TestMaxHoldReentryKeepsTTL(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts []dsync.Option
	}{{"script", nil}, {"client", []dsync.Option{dsync.ClientReentrancy()}}} {
		for _, kind := range []string{"mutex", "write", "read"} {
			t.Run(mode.name+"/"+kind, func(t *testing.T) {
				b, ctx, name := realName(t)
				opts := append([]dsync.Option{dsync.TTL(fixedReentryTTL), dsync.MaxHold(maxHoldReentry)}, mode.opts...)
				c := newClient(t, b, opts...)
				other := newClient(t, b, dsync.TTL(fixedReentryTTL))
				lock, lease, try := leaseKind(kind, c, other, name)
				checkReentryKeepsTTL(t, dsync.WithOwner(ctx), reentryAfter, lock, lease, try)
			})
		}
	}
}

// TestSemaphoreJoinKeepsTTL: under FixedLease or MaxHold, an Acquire that
// adds permits to a holding (a join) does not extend the holding in
// Redis: once the holding's Lease reports lost, another owner takes every
// permit. Both ways of joining: taking free permits, and being handed
// them while queued.
func TestSemaphoreJoinKeepsTTL(t *testing.T) {
	for _, lim := range []struct {
		name  string
		opt   dsync.Option
		after time.Duration
	}{{"fixed", dsync.FixedLease(), fixedReentryTTL / 2}, {"maxhold", dsync.MaxHold(maxHoldReentry), reentryAfter}} {
		t.Run(lim.name+"/free", func(t *testing.T) {
			b, ctx, name := realName(t)
			s := newClient(t, b, dsync.TTL(fixedReentryTTL), lim.opt).Semaphore(name, 2)
			other := newClient(t, b, dsync.TTL(fixedReentryTTL)).Semaphore(name, 2)
			acquire := func(ctx context.Context) error { return s.Acquire(ctx, 1) }
			try := func(ctx context.Context) (bool, error) { return other.TryAcquire(ctx, 2) }
			checkReentryKeepsTTL(t, dsync.WithOwner(ctx), lim.after, acquire, s.Lease, try)
		})
		t.Run(lim.name+"/handed", func(t *testing.T) {
			b, ctx, name := realName(t)
			s := newClient(t, b, dsync.TTL(fixedReentryTTL), lim.opt).Semaphore(name, 2)
			other := newClient(t, b, dsync.TTL(fixedReentryTTL)).Semaphore(name, 2)
			// The other permit is held by a third owner until the join
			// waits for it; its release hands it to the join.
			third := newClient(t, b, dsync.TTL(fixedReentryTTL)).Semaphore(name, 2)
			tctx := dsync.WithOwner(ctx)
			joins := 0
			acquire := func(ctx context.Context) error {
				joins++
				if joins == 1 {
					if err := s.Acquire(ctx, 1); err != nil {
						return err
					}
					return third.Acquire(tctx, 1)
				}
				done := make(chan error, 1)
				go func() { done <- s.Acquire(ctx, 1) }()
				waitQueued(t, b, name, 1)
				must(t, third.Release(tctx, 1))
				return <-done
			}
			try := func(ctx context.Context) (bool, error) { return other.TryAcquire(ctx, 2) }
			checkReentryKeepsTTL(t, dsync.WithOwner(ctx), lim.after, acquire, s.Lease, try)
		})
	}
}

// TestFixedLeaseReentryFromAnotherClient: under FixedLease a re-entry or
// join leaves the hold's expiry in Redis as the Lock that took it set it,
// also when it comes from another Client of the same owner (an owner
// token carried over, see dsync.WithOwnerToken). That Client's Lease must
// then end with the hold, not a TTL after its own call: past the hold's
// expiry another owner takes the name, and two Leases would be live at
// once. (Before, the other Client's Lease ran a whole TTL from its call,
// 1.5 s past the hold's end in Redis.)
func TestFixedLeaseReentryFromAnotherClient(t *testing.T) {
	type taker struct {
		lock  func(context.Context) error
		lease func(context.Context) (*dsync.Lease, error)
	}
	// (With ClientReentrancy an owner re-enters only in its own Client:
	// another Client's Lock waits, so there is no such re-entry.)
	kinds := []struct {
		name string
		opts []dsync.Option
		of   func(c *dsync.Client, name string) taker // the lock of name on c
	}{
		{"mutex/script", nil, func(c *dsync.Client, name string) taker {
			m := c.Mutex(name)
			return taker{m.Lock, m.Lease}
		}},
		{"write", nil, func(c *dsync.Client, name string) taker {
			rw := c.RWMutex(name)
			return taker{rw.Lock, rw.Lease}
		}},
		{"read", nil, func(c *dsync.Client, name string) taker {
			rw := c.RWMutex(name)
			return taker{rw.RLock, rw.RLease}
		}},
		{"semaphore", nil, func(c *dsync.Client, name string) taker {
			s := c.Semaphore(name, 2)
			return taker{func(ctx context.Context) error { return s.Acquire(ctx, 1) }, s.Lease}
		}},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			b, ctx, name := realName(t)
			opts := append([]dsync.Option{dsync.TTL(fixedReentryTTL), dsync.FixedLease()}, k.opts...)
			a := k.of(newClient(t, b, opts...), name)
			bb := k.of(newClient(t, b, opts...), name)
			actx := dsync.WithOwner(ctx)
			bctx := dsync.WithOwnerToken(ctx, dsync.OwnerToken(actx))
			checkLeaseEndsWithTheHold(t, actx, bctx, a.lock, a.lease, bb.lock, bb.lease, nil)
		})
	}
	t.Run("semaphore/handed", func(t *testing.T) {
		b, ctx, name := realName(t)
		opts := []dsync.Option{dsync.TTL(fixedReentryTTL), dsync.FixedLease()}
		sa := newClient(t, b, opts...).Semaphore(name, 2)
		sb := newClient(t, b, opts...).Semaphore(name, 2)
		third := newClient(t, b, dsync.TTL(10*time.Second)).Semaphore(name, 2)
		tctx := dsync.WithOwner(ctx)
		actx := dsync.WithOwner(ctx)
		bctx := dsync.WithOwnerToken(ctx, dsync.OwnerToken(actx))
		alock := func(ctx context.Context) error {
			if err := sa.Acquire(ctx, 1); err != nil {
				return err
			}
			return third.Acquire(tctx, 1)
		}
		// The other Client's Acquire waits until the third owner's
		// release hands it the permit, a join of the owner's holding.
		block := func() { waitQueued(t, b, name, 1); must(t, third.Release(tctx, 1)) }
		checkLeaseEndsWithTheHold(t, actx, bctx, alock, sa.Lease, func(ctx context.Context) error { return sb.Acquire(ctx, 1) }, sb.Lease, block)
	})
}

// checkLeaseEndsWithTheHold takes a FixedLease hold of TTL
// fixedReentryTTL by alock (actx an owner), re-enters or joins it half a
// TTL later by block (bctx the same owner, in another Client; with
// unblock, run beside it, the call waits until unblock lets it through),
// and checks that the second Lease ends (lost) no later than the hold's
// TTL from alock, plus 700 ms of slack for the Lease's timer: it ends
// when the hold does in Redis.
func checkLeaseEndsWithTheHold(t *testing.T, actx, bctx context.Context, alock func(context.Context) error, alease func(context.Context) (*dsync.Lease, error),
	block func(context.Context) error, blease func(context.Context) (*dsync.Lease, error), unblock func()) {
	t.Helper()
	start := time.Now()
	must(t, alock(actx))
	la, err := alease(actx)
	must(t, err)
	time.Sleep(time.Until(start.Add(fixedReentryTTL / 2)))
	if unblock != nil {
		done := make(chan error, 1)
		go func() { done <- block(bctx) }()
		unblock()
		must(t, <-done)
	} else {
		must(t, block(bctx))
	}
	lb, err := blease(bctx)
	must(t, err)
	if isDone(la) {
		t.Skip("the machine stalled: the hold's lease ended before the other Client's call returned")
	}
	if lb.Token() != la.Token() {
		t.Fatalf("the other Client's call got token %d, want the hold's %d (a re-entry or join)", lb.Token(), la.Token())
	}
	ended := waitDone(t, lb, 2*fixedReentryTTL, "after the hold's TTL")
	assertLeaseLost(t, lb)
	if late := ended.Sub(start.Add(fixedReentryTTL)); late > 700*time.Millisecond {
		t.Fatalf("the other Client's Lease ended %v after the hold's TTL from the Lock that took it: it outlived the hold in Redis", late.Round(time.Millisecond))
	}
}

// heldReply is a go-redis hook that, once armed, holds back the reply of
// the next script call by delay after the script ran: a reply late in the
// network.
type heldReply struct {
	armed atomic.Bool
	delay time.Duration
}

func (h *heldReply) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *heldReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); (n == "evalsha" || n == "eval") && h.armed.CompareAndSwap(true, false) {
			time.Sleep(h.delay)
		}
		return err
	}
}

func (h *heldReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestFixedLeaseReentryReplyAfterTheLeaseEnded: a FixedLease re-entry (or
// Semaphore join) runs 1 s before the hold's TTL ends, and its reply comes
// only after the hold's Lease was reported lost and Redis ended the hold.
// The Client has no live hold to add the level to, so it starts a Lease
// for the grant: that Lease must end with the hold in Redis (at once),
// not a TTL after the call, while another owner takes the name. (Before,
// it ran a TTL from the call: 1.5 s past another owner's TryLock.)
func TestFixedLeaseReentryReplyAfterTheLeaseEnded(t *testing.T) {
	for _, kind := range []string{"mutex", "write", "read", "semaphore"} {
		t.Run(kind, func(t *testing.T) {
			b, ctx, name := realName(t)
			late := &heldReply{delay: 1500 * time.Millisecond}
			c, _ := hookedClient(t, b, late, dsync.TTL(fixedReentryTTL), dsync.FixedLease())
			other := newClient(t, b, dsync.TTL(fixedReentryTTL))
			lock, lease, try := leaseKind(kind, c, other, name)
			octx := dsync.WithOwner(ctx)
			start := time.Now()
			must(t, lock(octx))
			first, err := lease(octx)
			must(t, err)
			time.Sleep(time.Until(start.Add(fixedReentryTTL - time.Second)))
			late.armed.Store(true)
			if err := lock(octx); err != nil {
				// A call that fails leaves nothing held: no Lease to check.
				t.Logf("the re-entry failed: %v", err)
				return
			}
			if !isDone(first) {
				t.Skip("the machine stalled: the hold's Lease had not ended when the late reply came")
			}
			l, err := lease(octx)
			if err != nil {
				t.Logf("no Lease after the re-entry: %v", err)
				return // nothing held: nothing outlives the hold
			}
			// Redis ended the hold at its TTL: another owner takes the name.
			cctx := dsync.WithOwner(ctx)
			waitFor(t, 5*time.Second, "another owner's try", func() bool {
				ok, err := try(cctx)
				must(t, err)
				return ok
			})
			select {
			case <-l.Done():
			case <-time.After(700 * time.Millisecond):
				t.Fatalf("another owner holds the name, yet the Lease the late re-entry started is live %v after the hold's TTL",
					time.Since(start.Add(fixedReentryTTL)).Round(time.Millisecond))
			}
		})
	}
}
