package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// A shared Semaphore handle (no owner) whose holding gets a second call's
// permits by a later hand-over (another holder's call gave up and its
// permit went to the handle's next call), as in the nemesis report of
// sem-mixed seed 339013158441357: the handle's release hands one permit to
// its call A (a fresh holding) and one to another Client's call Q; Q gives
// up (its ctx ends before it learns of it), and its abandon hands that
// permit to the handle's call B, which joins A's holding and moves its
// server deadline later. The handle's renewals then fail. Every Lease that
// the handle's callers got must end lost by its LeaseDeadline (plus a
// margin for a loaded machine), and that deadline must not be past the
// server's: the Lease is never live after Redis freed the permits.
func TestSemaphoreJoinedHoldingLeaseEndsInTime(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprintf("notificationsLate=%v", late), func(t *testing.T) {
			eachRealName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				testJoinedHolding(t, b, ctx, name, late)
			})
		})
	}
}

// heldMessages holds back the hand-over messages a Client receives while
// armed (see dsync.SetMessageHook), until released.
type heldMessages struct {
	mu    sync.Mutex
	armed bool
	all   bool // every message, not only hand-overs
	open  chan struct{}
	once  sync.Once
}

func newHeldMessages() *heldMessages { return &heldMessages{open: make(chan struct{})} }

func (h *heldMessages) arm() {
	h.mu.Lock()
	h.armed = true
	h.mu.Unlock()
}

func (h *heldMessages) release() { h.once.Do(func() { close(h.open) }) }

func (h *heldMessages) hook(_, payload string) {
	h.mu.Lock()
	armed := h.armed
	h.mu.Unlock()
	if armed && (h.all || len(strings.Fields(payload)) == 4) {
		select {
		case <-h.open:
		case <-time.After(30 * time.Second):
		}
	}
}

func testJoinedHolding(t *testing.T, b redistest.Backend, ctx context.Context, name string, late bool) {
	const (
		size   = 2
		ttl    = 1500 * time.Millisecond
		margin = 2 * time.Second // a loaded machine
	)
	k := semKeys(name)
	rdb := b.NewClient(t)

	cMsgs := newHeldMessages()
	c := newClient(t, b, dsync.TTL(ttl))
	t.Cleanup(cMsgs.release) // before c's Close (cleanups run last first)
	dsync.SetMessageHook(c, cMsgs.hook)
	s := c.Semaphore(name, size)

	qMsgs := newHeldMessages()
	// Q's attempts after the hand-over to it are held back: Q learns of
	// it from none (nor from its notification, below) before it gives up.
	qGate := newFirstGate("semaphore_acquire")
	qc, _ := hookedClient(t, b, qGate)
	t.Cleanup(qMsgs.release)
	t.Cleanup(qGate.drop)
	dsync.SetMessageHook(qc, qMsgs.hook)
	q := qc.Semaphore(name, size)

	// The handle's earlier holding X, of both permits.
	must(t, s.Acquire(ctx, size))
	queued := func(n int64) func() bool {
		return func() bool { return rdb.ZCard(ctx, k.Queue).Val() == n }
	}
	type res struct {
		err  error
		at   time.Time
		l    *dsync.Lease
		lErr error
	}
	acq := func(n int64) <-chan res {
		ch := make(chan res, 1)
		go func() {
			err := s.Acquire(ctx, n)
			r := res{err: err, at: time.Now()}
			if err == nil {
				r.l, r.lErr = s.Lease(ctx)
			}
			ch <- r
		}()
		return ch
	}
	aIn := acq(1)
	waitFor(t, 10*time.Second, "A queued", queued(1))
	qctx, qcancel := context.WithCancel(ctx)
	defer qcancel()
	qIn := async(func() error { return q.Acquire(qctx, 1) })
	waitFor(t, 10*time.Second, "Q queued", queued(2))
	bIn := acq(1)
	waitFor(t, 10*time.Second, "B queued", queued(3))

	qMsgs.arm() // Q does not hear of its hand-over
	qGate.arm(t)
	if late {
		cMsgs.arm() // nor do A and B: they learn from their next attempts
	}
	// Renewals of the handle fail from now on: its renewer is stalled.
	stall := make(chan struct{})
	var stallOnce sync.Once
	unstall := func() { stallOnce.Do(func() { close(stall) }) }
	t.Cleanup(unstall)            // before c's Close
	must(t, s.Release(ctx, size)) // X ends: one permit to A, one to Q
	dsync.SetRenewStall(c, func() {
		select {
		case <-stall:
		case <-time.After(time.Minute):
		}
	})
	time.Sleep(300 * time.Millisecond)
	qcancel()    // Q gives up; its abandon hands its permit to B
	qGate.drop() // an attempt of Q's held back fails unsent
	if err := <-qIn; !errors.Is(err, context.Canceled) {
		t.Fatalf("Q = %v, want it cancelled", err)
	}
	waitFor(t, 10*time.Second, "B served", queued(0))

	var leases []res
	for _, ch := range []<-chan res{aIn, bIn} {
		select {
		case r := <-ch:
			must(t, r.err)
			must(t, r.lErr)
			leases = append(leases, r)
		case <-time.After(10 * time.Second):
			t.Fatal("an Acquire of the handle did not return")
		}
	}

	// Redis-side: the handle's holding, its permits and server deadline.
	tok, dl := "", int64(0)
	zs, err := rdb.ZRangeWithScores(ctx, k.Holders, 0, -1).Result()
	must(t, err)
	if len(zs) != 1 {
		t.Fatalf("holders %v, want the handle's alone", zs)
	}
	tok, dl = zs[0].Member.(string), int64(zs[0].Score)
	n, err := rdb.HGet(ctx, k.State, tok).Int64()
	must(t, err)
	if n != 2 {
		t.Fatalf("the handle's holding has %d permits, want 2", n)
	}
	f, err := rdb.HGet(ctx, k.State, ":f:"+tok).Result()
	must(t, err)
	serverDL := time.UnixMilli(dl)
	t.Logf("server deadline %v from now; fence %s", time.Until(serverDL).Round(time.Millisecond), f)

	for i, r := range leases {
		if got := strconv.FormatUint(r.l.Token(), 10); got != f {
			t.Errorf("lease %d: token %s, the holding's is %s", i, got, f)
		}
		ld := dsync.LeaseDeadline(r.l)
		if ld.After(serverDL.Add(5 * time.Millisecond)) {
			t.Errorf("lease %d: LeaseDeadline %v after the server's deadline (by %v)", i, ld, ld.Sub(serverDL))
		}
		select {
		case <-r.l.Done():
		case <-time.After(time.Until(ld) + margin):
			t.Fatalf("lease %d: Done not closed %v after its LeaseDeadline", i, margin)
		}
		if err := r.l.Err(); !errors.Is(err, dsync.ErrLeaseLost) {
			t.Errorf("lease %d: Err = %v, want ErrLeaseLost", i, err)
		}
	}
	// The server frees the permits at its deadline: another Client takes
	// both once it passed, and not before the leases ended (checked above).
	unstall()
	cMsgs.release()
	ok, err := newClient(t, b).Semaphore(name, size).TryAcquire(ctx, size)
	must(t, err)
	if time.Now().After(serverDL.Add(50*time.Millisecond)) && !ok {
		t.Errorf("the holding's deadline passed, yet another Client cannot take both permits")
	}
	_ = redis.Nil
}

// A waiting call is handed the hold, but its notification is late; the
// name's keys are deleted (remote state lost: the server forgets the
// grant and the call's id), another Client takes the name, and the call's
// next attempt is refused (queued afresh). The late hand-over then
// arrives. It proves only that a script once granted the call a hold,
// before that refusal: the call must not return on it as if it held (a
// hold Redis does not have, its lease measured from the refused attempt),
// and must not leave its new queue place behind, to which the next
// release would hand the hold, held then by nobody. (The mechanism of a
// nemesis "permits" report, sem-mixed seed 882272348081216.) Mutex,
// RWMutex write and Semaphore, by handle and by owner. The refused attempt
// is either the call's next after the hand-over ("asleep": the call slept
// through it), or one it sent before the hand-over that reached Redis only
// after the deletion ("delayed": held up in the network), whose sending
// tells nothing of when the hand-over was granted.
func TestStaleHandoverAfterRefusal(t *testing.T) {
	kinds := []struct {
		name, script string
		kind         holdKind
		queue        func(string) string
		keys         func(string) []string
	}{
		{"Mutex", "mutex_lock", mutexHold, func(n string) string { return mutexKeys(n).Queue }, func(n string) []string { return mutexKeys(n).Keys() }},
		{"RWMutex", "rwmutex_lock", writeHold, func(n string) string { return rwk(n).WriterQueue }, func(n string) []string { return rwk(n).Keys() }},
		{"Semaphore", "semaphore_acquire", semHold(1, 1), func(n string) string { return semKeys(n).Queue }, func(n string) []string { return semKeys(n).Keys() }},
	}
	for _, k := range kinds {
		for _, owned := range []bool{false, true} {
			for _, delayed := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/owned=%v/delayed=%v", k.name, owned, delayed), func(t *testing.T) {
					eachRealName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
						testStaleHandover(t, b, ctx, name, owned, delayed, k.script, k.kind, k.queue(name), k.keys(name))
					})
				})
			}
		}
	}
}

// nthRun holds back the nth run (from 1) of a script through its client
// until open is closed, and counts the runs answered.
type nthRun struct {
	sha            string
	n              int64
	seen, answered atomic.Int64
	caught, open   chan struct{}
	opened         sync.Once
}

func newNthRun(script string, n int64) *nthRun {
	return &nthRun{sha: lua.Script(script).Hash(), n: n, caught: make(chan struct{}), open: make(chan struct{})}
}

func (g *nthRun) release() { g.opened.Do(func() { close(g.open) }) }

func (g *nthRun) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *nthRun) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !runsScript(cmd, g.sha) {
			return next(ctx, cmd)
		}
		if g.seen.Add(1) == g.n {
			close(g.caught)
			<-g.open
		}
		defer g.answered.Add(1)
		return next(ctx, cmd)
	}
}

func (g *nthRun) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func testStaleHandover(t *testing.T, b redistest.Backend, ctx context.Context, name string, owned, delayed bool, script string, kind holdKind, queue string, keys []string) {
	const ttl = 3 * time.Second
	rdb := b.NewClient(t)

	w := startStaleWaiter(t, b, ctx, name, script, ttl, owned, delayed, kind, kind)
	msgs, gate, s, cctx, o, got := w.msgs, w.gate, w.s, w.cctx, w.o, w.got
	if n := rdb.ZCard(ctx, queue).Val(); n != 1 {
		t.Fatalf("%d queued, want the call", n)
	}
	msgs.arm()
	must(t, o.unlock(ctx)) // hands the hold to the call; its notification is held
	// Remote state lost: every key of the name deleted (the fence hash
	// and call ids too), as the nemesis does.
	must(t, rdb.Unlink(ctx, keys...).Err())
	o2 := kind(newClient(t, b, dsync.TTL(ttl)), name)
	ok, err := o2.try(ctx)
	must(t, err)
	if !ok {
		t.Fatal("another Client could not take the name after the deletion")
	}
	gate.release()
	// The call's next attempt (within half its TTL) is refused: queued
	// afresh behind o2.
	waitFor(t, 10*time.Second, "the call's next attempt queued it afresh", func() bool {
		return rdb.ZCard(ctx, queue).Val() == 1
	})
	msgs.release() // the late hand-over arrives
	select {
	case err := <-got:
		if err == nil {
			t.Errorf("the call returned nil on a stale hand-over while another Client holds the name")
			if l, err := s.lease(cctx); err == nil {
				t.Logf("its Lease: token %d, Err %v, deadline in %v", l.Token(), l.Err(), time.Until(dsync.LeaseDeadline(l)).Round(time.Millisecond))
			}
		}
	case <-time.After(300 * time.Millisecond):
		// Still waiting, as it should: it gets the hold once o2 gives
		// it back.
		must(t, o2.unlock(ctx))
		recvNil(t, got, 10*time.Second, "the call did not get the hold after o2's release")
		must(t, s.unlock(cctx))
		return
	}
	// Whatever the call was told, no place of it may stay queued once
	// it returned: o2's release would hand the hold to nobody.
	must(t, o2.unlock(ctx))
	time.Sleep(100 * time.Millisecond)
	ok, err = kind(newClient(t, b), name).try(ctx)
	must(t, err)
	if !ok {
		t.Errorf("after o2's release the hold went to a call that had returned: held by nobody until its TTL")
	}
}

// A staleWaiter is a call waiting for a name behind another Client's hold,
// set up for a late hand-over (see startStaleWaiter).
type staleWaiter struct {
	msgs *heldMessages // the call's Client's messages, held once armed
	gate *nthRun       // holds the call's nth attempt of the lock script
	s    holdCalls     // the waiting call's handle
	cctx context.Context
	o    holdCalls // the other Client's hold, taken
	got  <-chan error
}

// startStaleWaiter has another Client take name through a hold of kind
// holder and a call through a kind handle wait for it (with an owner if
// owned), on a Client with TTL ttl whose messages are held once armed
// (all of them) and whose nth run of script is held back: the call's
// first attempt queues it; a fresh Client subscribes only then, so the
// call attempts once more at once (a release may have been missed), and
// then sleeps, half its TTL at most. Delayed: that second attempt is held
// back, sent before a hand-over; else the third, which the call makes
// after it. It returns once that attempt is caught (delayed) or the first
// two are answered.
func startStaleWaiter(t *testing.T, b redistest.Backend, ctx context.Context, name, script string, ttl time.Duration, owned, delayed bool, kind, holder holdKind) staleWaiter {
	t.Helper()
	w := staleWaiter{msgs: newHeldMessages(), gate: newNthRun(script, 3), cctx: ctx}
	w.msgs.all = true // also the wake-ups that would make it ask at once
	if delayed {
		w.gate.n = 2
	}
	c, _ := hookedClient(t, b, w.gate, dsync.TTL(ttl))
	t.Cleanup(w.gate.release) // before c's Close
	t.Cleanup(w.msgs.release)
	dsync.SetMessageHook(c, w.msgs.hook)
	w.s = kind(c, name)
	if owned {
		w.cctx = dsync.WithOwner(ctx)
	}
	w.o = holder(newClient(t, b, dsync.TTL(ttl)), name)
	must(t, w.o.lock(ctx))
	w.got = async(func() error { return w.s.lock(w.cctx) })
	if delayed {
		select {
		case <-w.gate.caught:
		case <-time.After(10 * time.Second):
			t.Fatal("the call made no second attempt")
		}
	} else {
		waitFor(t, 10*time.Second, "the call's first two attempts answered", func() bool { return w.gate.answered.Load() == 2 })
	}
	return w
}
