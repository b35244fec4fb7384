package dsync

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/dsync-go/dsync/renew"
)

// Cohorts. When several calls of one Client wait for the same name, the
// Client need not queue each of them in Redis and wake each through a
// notification: one of them (a member) takes its turn in the Redis queue
// as any waiter does, the others wait in the process behind it, and the
// release of a member's hold passes the lock straight to the first of
// them, in the release's own script (lua/mutex_unlock.lua ARGV[9..12], and
// for RWMutex writers lua/rwmutex_unlock.lua ARGV[10..13]).
// The pass is a grant like any other: a new hold of the waiting call, with
// a fencing token larger than every earlier one, written by the script
// that ends the releaser's hold; the call learns of it from the release's
// reply, without an attempt of its own, a notification or a wake-up
// through the pub/sub connection. This is lock cohorting (Dice, Marathe and
// Shavit, PPoPP 2012).
//
// Passes are bounded: while others are queued in Redis, the script passes
// at most cohortPasses times in a row and then hands the lock to the head
// of the Redis queue, so a waiter of another process waits for that many
// holds at most before its turn. The calls waiting in the process are
// served in arrival order.
//
// Nothing here decides who holds a lock: Redis does. A pass whose reply is
// lost leaves the waiting call to ask Redis itself, with its own attempt
// under the id the pass named; a waiting call that gives up after a pass
// was sent to it has that id abandoned, as any call that gives up. The
// bookkeeping below only decides who tries next; an error in it can delay
// a call (a waiter goes to Redis itself after TTL/cohortWaitMax),
// never let two calls hold.

// cohortPasses is how many times in a row a release passes the lock to a
// call waiting in the same process while others are queued in Redis.
const cohortPasses = 8

var cohortPassesArg any = strconv.Itoa(cohortPasses)

// cohorts are the cohorts of one Client, by lock key.
type cohorts struct {
	mu sync.Mutex
	m  map[string]*cohort
}

// A cohort is the calls of one Client for one name that go through it:
// members, which hold the name or try to take it in Redis, and the calls
// that wait in the process for a member to pass the lock on.
type cohort struct {
	members int
	waiters []*cohortWaiter // in arrival order
}

// A cohortWaiter is one call waiting in its process (see cohorts.join).
type cohortWaiter struct {
	key string
	tok any    // the call's holder token, boxed
	id  string // the call's id: a pass names it
	ttl any    // the call's lease TTL (ms), boxed
	msg chan cohortMsg
	// Guarded by cohorts.mu: claimed once a release took it to pass the
	// lock to; gone once its caller gave up after that.
	claimed, gone bool
	// passSent is the send time of the release that tried to pass the lock
	// to this call, zero if none did: a hold that pass may have given it is
	// measured from then.
	passSent time.Time
}

// A cohortMsg tells a waiter how its wait in the process ended: with a
// pass (g, a hold of its own), or with its turn to try in Redis.
type cohortMsg struct {
	passed bool
	g      grant
}

// cohortPool recycles the cohorts of names that no call of a Client waits
// for or holds any more: an uncontended Lock makes one and drops it.
var cohortPool = sync.Pool{New: func() any { return new(cohort) }}

// join makes a Lock call (holder token tok, id, lease TTL ttl) a member of
// key's cohort if the cohort has none, and returns nil: the call goes to
// Redis. Otherwise it returns the call's place among the cohort's waiters,
// where it waits in the process (see wait).
func (cs *cohorts) join(key string, tok any, id string, ttl any) *cohortWaiter {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m == nil {
		cs.m = make(map[string]*cohort)
	}
	co := cs.m[key]
	if co == nil {
		co = cohortPool.Get().(*cohort)
		cs.m[key] = co
	}
	if co.members == 0 {
		co.members = 1
		return nil
	}
	w := &cohortWaiter{key: key, tok: tok, id: id, ttl: ttl, msg: make(chan cohortMsg, 1)}
	co.waiters = append(co.waiters, w)
	return w
}

// A call waits in the process for its lease TTL / cohortWaitMax at most
// before it goes to Redis itself: members may hold the name longer than
// that (a long critical section, a hold gone from Redis before its
// renewer found out: a member's membership ends once its hold is found
// lost), and Redis, not the process, knows when the name is free.
const cohortWaitMax = 2

// wait waits for w's turn, which join said it must, until ctx ends or the
// Client closes. It returns the message that ended the wait: w's call is a
// member of the cohort from then on (with a pass, the holder). A wait that
// lasts ttl/cohortWaitMax ends as if with a turn. On an error the call is a
// member, and has to leave as one, only if got is true (a message came
// first); with a pass, it also holds what the pass gave it.
func (cs *cohorts) wait(ctx context.Context, w *cohortWaiter, ttl time.Duration, closed <-chan struct{}) (m cohortMsg, got bool, err error) {
	t := getTimer(max(ttl/cohortWaitMax, minRetry))
	defer putTimer(t)
	timeout := t.C
	for {
		select {
		case m := <-w.msg:
			return m, true, nil
		case <-timeout:
			cs.mu.Lock()
			if !w.claimed {
				cs.remove(w)
				if co := cs.m[w.key]; co != nil {
					co.members++
				}
				cs.mu.Unlock()
				return cohortMsg{}, true, nil
			}
			cs.mu.Unlock()
			// A release is passing the lock to w, or has: its message
			// comes soon.
			timeout = nil
			continue
		case <-ctx.Done():
			err = ctx.Err()
		case <-closed:
			err = ErrClosed
		}
		cs.mu.Lock()
		defer cs.mu.Unlock()
		select {
		case m := <-w.msg:
			return m, true, err
		default:
		}
		if w.claimed {
			w.gone = true // the release that claimed w undoes what it gave
		} else {
			cs.remove(w)
		}
		return cohortMsg{}, false, err
	}
}

// remove takes w out of its cohort's waiters; cs.mu is held.
func (cs *cohorts) remove(w *cohortWaiter) {
	co := cs.m[w.key]
	for i, x := range co.waiters {
		if x == w {
			co.waiters = append(co.waiters[:i], co.waiters[i+1:]...)
			return
		}
	}
}

// claim takes the first call waiting for key in the process, for a
// release to pass the lock to; nil if there is none.
func (cs *cohorts) claim(key string) *cohortWaiter {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if co := cs.m[key]; co != nil {
		return co.claimFirst()
	}
	return nil
}

// claimFirst takes co's first waiter out of its waiters, claimed; nil if
// there is none. cohorts.mu is held.
func (co *cohort) claimFirst() *cohortWaiter {
	if len(co.waiters) == 0 {
		return nil
	}
	w := co.waiters[0]
	co.waiters[0] = nil
	co.waiters = co.waiters[1:]
	w.claimed = true
	return w
}

// deliver ends the wait of w, claimed, with m, which makes w's call a
// member in place of the releaser. It reports false if w's caller gave up:
// then the releaser's membership ends (see leave) and, if m is a pass, the
// releaser has to undo it.
func (cs *cohorts) deliver(w *cohortWaiter, m cohortMsg) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if w.gone {
		cs.leaveLocked(w.key)
		return false
	}
	w.msg <- m
	return true
}

// leave ends the membership of a call of key's cohort (its hold released,
// or its attempts given up): the first waiter, if any, takes its turn.
func (cs *cohorts) leave(key string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.leaveLocked(key)
}

func (cs *cohorts) leaveLocked(key string) {
	co := cs.m[key]
	if co == nil {
		return
	}
	if w := co.claimFirst(); w != nil {
		w.msg <- cohortMsg{}
		return
	}
	if co.members--; co.members == 0 {
		delete(cs.m, key)
		clear(co.waiters[:cap(co.waiters)])
		co.waiters = co.waiters[:0]
		cohortPool.Put(co)
	}
}

// cohortAwait runs the part of a waiting Lock call without an owner
// (holder token tok, call id, lease TTL ttl, boxed as ttlArg) that goes
// through key's cohort: the call becomes a member, after waiting in the
// process for its turn if another member holds the name or tries for it. It
// returns the call's place among the waiters (nil if it went straight to
// Redis) and, if a release passed the lock to it, the hold the pass gave
// (passed). On an error the call is no member, and a pass it got
// meanwhile is undone through u.
func (c *Client) cohortAwait(ctx context.Context, key string, tok any, id string, ttlArg any, ttl time.Duration, u abandoner) (cw *cohortWaiter, g grant, passed bool, err error) {
	cs := &c.cohorts
	if cw = cs.join(key, tok, id, ttlArg); cw == nil {
		return nil, grant{}, false, nil
	}
	msg, got, err := cs.wait(ctx, cw, ttl, c.closed)
	if err != nil {
		if got {
			if msg.passed || !cw.passSent.IsZero() {
				// A pass, or a release that tried to pass to the call and
				// whose outcome may be a hold or a waiting place of it.
				c.cleanup(ctx, u)
			}
			cs.leave(key)
		}
		return cw, grant{}, false, err
	}
	return cw, msg.g, msg.passed, nil
}

// lockOf is one lock call of a Mutex or an RWMutex mode, as lockHold
// drives it.
type lockOf struct {
	a      *acquisition
	op     lockOp
	tok    any  // the holder token, boxed
	wait   bool // Lock (waits), not TryLock
	cohort bool // a waiting call without an owner goes through key's cohort
	key    string
	ttlArg any
	// replicate, if not nil, makes sure a hold taken or handed reached
	// the replicas (WaitReplicas); its error fails the call.
	replicate func(g grant) error
}

// A lockOp is a lock call of a Mutex or an RWMutex mode, as the engine
// drives it, which records the hold it is granted.
type lockOp interface {
	acquirer
	// record records the hold grant g gave the call, its lease starting
	// at start; member: the call is a member of its cohort. errSuperseded:
	// the owner's call was undone, and starts again.
	record(ctx context.Context, g grant, start time.Time, member bool) (bool, error)
}

// lockHold runs lock call l: through its cohort, if it goes through one
// (it may wait in the process for a release to pass it the lock, see
// cohortAwait), and the engine (take). An owner's call whose grant was
// superseded (see errSuperseded) starts again as a new call, and so
// re-enters the owner's hold.
func (c *Client) lockHold(ctx context.Context, ttl time.Duration, l lockOf) (bool, error) {
	// member: the call is a member of its cohort; cw: its place among the
	// cohort's waiters, if it had to wait in the process.
	member, cw := false, (*cohortWaiter)(nil)
	if l.cohort {
		member = true
		g, passed, err := grant{}, false, error(nil)
		if cw, g, passed, err = c.cohortAwait(ctx, l.key, l.tok, l.a.to.id, l.ttlArg, ttl, l.op); err != nil {
			return false, err
		} else if passed {
			if c.isClosed() {
				// As take does for a grant that Close came first to:
				// nobody would renew the hold.
				c.cleanup(ctx, l.op)
				c.cohorts.leave(l.key)
				return false, ErrClosed
			}
			return l.op.record(ctx, g, cw.passSent, true)
		}
	}
	for {
		g, start, err := c.take(ctx, l.a, l.op, l.wait)
		start = cw.leaseStart(start)
		if err == nil && g.kind == final {
			err = g.err
		}
		if err == nil && (g.kind == taken || g.kind == handed) && l.replicate != nil {
			if err = l.replicate(g); err != nil {
				c.cleanup(ctx, l.op)
			}
		}
		if err != nil || (g.kind != taken && g.kind != handed) {
			if member {
				c.cohorts.leave(l.key)
			}
			return false, err
		}
		ok, err := l.op.record(ctx, g, start, member)
		if err != errSuperseded {
			return ok, err
		}
		// An owner's call whose hold ended before it learned of it, the
		// owner holding the name afresh since (held undid the call): it
		// starts again as a new call, and re-enters that hold. (Owners'
		// calls are no cohort members.)
		if err := c.restartCall(ctx, l.op); err != nil {
			return false, err
		}
	}
}

// leaseStart returns when the lease of a hold that w's call took in Redis,
// by an attempt sent at start, begins: at the send time of a pass to w
// whose outcome is unknown, if that is earlier (the pass may have given
// the hold).
func (w *cohortWaiter) leaseStart(start time.Time) time.Time {
	if w != nil && !w.passSent.IsZero() && w.passSent.Before(start) {
		return w.passSent
	}
	return start
}

// cohortRelease runs the first release of a member's hold of key, which
// ends the membership (see mutexScripts.unlock): run sends the release
// script, with the pass arguments of w (the first call waiting in the
// process) if w is not nil, and returns its reply; a reply that passed the
// lock ({4, fencing token}) gives w its hold, and any other ends w's wait
// with its turn to try in Redis. If w's caller gave up meanwhile, the pass
// is undone through undo(w). It returns run's reply, and whether it
// passed the lock.
func (c *Client) cohortRelease(ctx context.Context, key string, run func(w *cohortWaiter) (any, error), undo func(w *cohortWaiter) abandoner) (rep any, passed bool, err error) {
	// Counted as a call in progress (see inflight) when it can be: an
	// undo of a pass then runs before Close returns.
	if c.begin() {
		defer c.end()
	}
	cs := &c.cohorts
	w := cs.claim(key)
	if w == nil {
		defer cs.leave(key)
		rep, err = run(nil)
		return rep, false, err
	}
	w.passSent = time.Now()
	if rep, err = run(w); err != nil {
		// The outcome is unknown: the waiter asks Redis itself, under the
		// id the pass named (its lease measured from passSent). If it
		// gave up, what the release may have given it is undone.
		if !cs.deliver(w, cohortMsg{}) {
			c.cleanup(ctx, undo(w))
		}
		return nil, false, err
	}
	g, ok := passGrant(rep)
	if !ok {
		// Released without a pass (or not at all): the waiter tries in
		// Redis in the releaser's place. The release may have given it a
		// waiting place (an RWMutex writer behind readers): if it gave up,
		// that is undone too.
		if !cs.deliver(w, cohortMsg{}) {
			c.cleanup(ctx, undo(w))
		}
		return rep, false, nil
	}
	if !cs.deliver(w, cohortMsg{passed: true, g: g}) {
		// The waiter gave up: undo the pass.
		c.cleanup(ctx, undo(w))
	}
	return rep, true, nil
}

// startHoldOf begins renewing hold id, taken at start, as spec says. With
// member, it is the hold of a member of key's cohort: the first of its
// release and its loss ends the membership. A hold lost without a release
// (expired, removed, not renewed in time) so leaves the calls waiting in
// the process to try in Redis at once, not to wait for an Unlock that may
// be long in coming.
func (c *Client) startHoldOf(cfg *config, spec renew.Spec, id holdID, start time.Time, member bool, key string) *hold {
	h := &hold{holdID: id, count: 1}
	if member {
		h.cohort.Store(true)
		h.co, h.coKey = &c.cohorts, key
		spec.Lost = h
	}
	return c.renewHold(h, cfg, spec, start)
}

// LeaseLost ends the cohort membership of h's call, if h is a member's
// hold and its release has not ended it already (see startHoldOf).
func (h *hold) LeaseLost() {
	if h.cohort.CompareAndSwap(true, false) {
		h.co.leave(h.coKey)
	}
}

// passGrant decodes the reply {4, fencing token} of a release that passed
// the lock (see cohortRelease) into the grant of the call it went to.
func passGrant(rep any) (grant, bool) {
	r, ok := rep.([]any)
	if !ok || len(r) != 2 {
		return grant{}, false
	}
	code, err := replyInt(r[0])
	if err != nil || code != 4 {
		return grant{}, false
	}
	v, err := replyInt(r[1])
	if err != nil {
		return grant{}, false
	}
	f, err := checkFence(v)
	if err != nil {
		return grant{}, false
	}
	g := grant{kind: handed, fence: f, fenceArg: r[1]}
	if _, ok := r[1].(int64); !ok {
		g.fenceArg = int64(f)
	}
	return g, true
}

// releaseCode returns the code of a release's reply rep (see
// cohortRelease): 1 for a release that passed the lock.
func releaseCode(rep any, passed bool, err error, script string) (int64, error) {
	if err != nil {
		return 0, err
	}
	if passed {
		return 1, nil
	}
	if r, ok := rep.(int64); ok {
		return r, nil
	}
	return 0, replyError(script, rep)
}
