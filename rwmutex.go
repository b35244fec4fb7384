package dsync

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/dsync-go/dsync/renew"
)

// finishedKeep is how long an RWMutex remembers the id of a call that
// finished (a full release, an abandoned lock call), so that a retry of it
// after a lost reply, or its late arrival, changes nothing. It bounds how
// long one go-redis call, with its retries, may take.
const finishedKeep = 2 * releaseTimeout

// Lock modes, as the scripts spell them.
const (
	modeRead  = "r"
	modeWrite = "w"
)

// An RWMutex is a reader/writer mutual exclusion lock shared by every
// process that names it, the distributed twin of [sync.RWMutex]: any number
// of readers or one writer hold it. Get one with [Client.RWMutex]; an
// RWMutex handle is safe for concurrent use and cheap, so make one where
// needed.
//
// Without an owner in ctx a handle behaves like sync.RWMutex: it is not
// reentrant, it remembers the holds it took (its write hold and each of its
// read holds), and any goroutine using the handle may unlock them; RUnlock
// releases the handle's most recent read hold. With an owner (see
// [WithOwner]) both modes are reentrant per owner (each lock needs one
// unlock), and only the owner may unlock. An owner that holds the write lock
// may also RLock and then Unlock, keeping a read hold (a downgrade); an owner
// that holds a read lock and asks for the write lock gets [ErrUpgrade] at
// once, where sync.RWMutex would deadlock. With [ClientReentrancy] an owner's
// re-entries of either mode are counted in the process and cost no round
// trip.
//
// Unlike sync.RWMutex, every hold has a lease (see [TTL]), renewed by the
// Client while the hold lives. Each reader has its own: a reader that dies
// frees its share when its lease runs out, whatever the other readers do.
// Each fresh write acquisition gets a fencing token larger than every
// earlier one of the name ([Lease.Token]); read holds carry none. On a
// Client made by [NewQuorum] every hold, read or write, is granted by a
// majority of independent masters.
//
// Writers are preferred, as in sync.RWMutex: once a writer waits, new
// readers wait too (an owner re-entering its read hold does not), so a
// stream of readers cannot starve a writer; and a writer's Unlock makes
// every reader that waited for it a holder at once, so a stream of writers
// cannot starve readers. No writer starves other writers either: as in
// sync.Mutex's starvation mode, a writer that has waited more than a
// millisecond takes a place in a queue kept in Redis, newcomer writers
// (including one that just unlocked) queue behind it, and the release that
// frees the lock (the last RUnlock, or an Unlock with no reader waiting)
// hands it straight to the first in line. Waiters are woken by
// notifications, not by polling. On a Client made by [NewQuorum] writers do
// not queue.
type RWMutex struct {
	c    *Client
	cfg  config
	name string
	// writer hash, fence hash, readers zset, readers hash, waiting writers
	// zset, waiting readers hash, finished calls zset, writers' queue zset,
	// queued writers hash
	keys  []string
	kargs []any // keys boxed once (see boxKeys)
	err   error

	subs []*RWMutex // quorum mode: this handle on each member (see quorum.go)

	slot  slot // the handle's write hold, without an owner in ctx
	mu    sync.Mutex
	reads []*hold // the handle's read holds, without an owner, latest last
}

// RWMutex returns a handle on the RWMutex called name. Options override the
// Client's defaults for this handle. An empty name or a bad option makes
// every call on the handle fail with [ErrInvalid]. An RWMutex and a [Mutex]
// of the same name are distinct locks.
func (c *Client) RWMutex(name string, opts ...Option) *RWMutex {
	rw := &RWMutex{c: c, name: name, slot: newSlot()}
	rw.cfg, rw.err = c.handleConfig(name, opts)
	k := rw.cfg.keyOf(name) + ":rw"
	rw.keys = []string{k, k + ":f", k + ":r", k + ":rc", k + ":ww", k + ":rq", k + ":x", k + ":wq", k + ":wd"}
	rw.kargs = boxKeys(rw.keys)
	if c != nil && c.q != nil {
		rw.subs = c.q.rwmutexes(name, opts)
	}
	return rw
}

func (rw *RWMutex) check() error {
	if rw == nil {
		return fmt.Errorf("%w: nil RWMutex", ErrInvalid)
	}
	if err := rw.c.check(); err != nil {
		return err
	}
	return rw.err
}

// RLock locks rw for reading, waiting while a writer holds it or waits for
// it, until ctx is done. On success the read hold lasts until RUnlock,
// renewed by the Client; with an owner in ctx that already reads (or writes)
// rw, RLock takes (another level of) a read hold at once. On failure it
// returns an error for which errors.Is(err, ctx.Err()) holds (or a Redis or
// [ErrClosed] error) and leaves no hold behind, also when the server granted
// the hold but the reply was lost.
func (rw *RWMutex) RLock(ctx context.Context) error {
	_, err := rw.lock(ctx, modeRead, true)
	return err
}

// TryRLock tries to lock rw for reading once, without waiting, and reports
// whether it succeeded. It fails while a writer holds rw or waits for it,
// unless ctx's owner already reads or writes rw. An error means the attempt
// could not be made or its outcome is unknown; then no hold is left behind.
func (rw *RWMutex) TryRLock(ctx context.Context) (bool, error) {
	return rw.lock(ctx, modeRead, false)
}

// Lock locks rw for writing, waiting until no reader and no other writer
// holds it, or until ctx is done. While it waits, new readers wait too;
// once it has waited a while, newcomer writers wait behind it. On
// success the hold lasts until Unlock, renewed by the Client; with an owner
// in ctx that already writes rw, Lock re-enters at once. If ctx's owner
// holds a read lock on rw (and not the write lock), Lock returns
// [ErrUpgrade] at once. On failure it returns an error for which
// errors.Is(err, ctx.Err()) holds (or a Redis or [ErrClosed] error) and
// leaves no hold behind, also when the server took the lock but the reply
// was lost; readers that waited behind it go on at once.
func (rw *RWMutex) Lock(ctx context.Context) error {
	_, err := rw.lock(ctx, modeWrite, true)
	return err
}

// TryLock tries to lock rw for writing once, without waiting, and reports
// whether it succeeded. It fails while anyone else reads or writes rw or
// writers are queued for it, and returns [ErrUpgrade] if ctx's owner reads
// it. An error means the attempt could not be made or its outcome is
// unknown; then no hold is left behind.
func (rw *RWMutex) TryLock(ctx context.Context) (bool, error) {
	return rw.lock(ctx, modeWrite, false)
}

func (rw *RWMutex) lock(ctx context.Context, mode string, wait bool) (bool, error) {
	if err := rw.check(); err != nil {
		return false, err
	}
	otok, owned, err := owner(ctx)
	if err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if owned && rw.cfg.local && rw.c.reenter(rw.holdKey(mode, otok)) {
		return true, nil
	}
	tok := otok
	if owned {
		tok = rw.c.holderToken(&rw.cfg, otok)
	} else {
		if mode == modeWrite {
			// The handle is write-locked from Lock to Unlock, as a
			// sync.RWMutex is, also when its hold was lost meanwhile.
			if ok, err := rw.slot.enter(ctx, wait, rw.c.closed); !ok || err != nil {
				return false, err
			}
		}
		tok = newToken()
	}
	ok, err := rw.lockAs(ctx, mode, otok, tok, owned, wait)
	if !ok && !owned && mode == modeWrite {
		rw.slot.leave()
	}
	return ok, err
}

func (rw *RWMutex) lockAs(ctx context.Context, mode, otok, tok string, owned, wait bool) (bool, error) {
	if rw.subs != nil {
		return rw.quorumLock(ctx, mode, otok, tok, owned, wait)
	}
	id := newCallID()
	a := &acquisition{ch: rw.keys[0], to: newAddressee(tok, id), ttl: rw.cfg.ttl}
	a.attempt = func(ctx context.Context, queue bool) (grant, error) {
		// Writers queue from their first refused attempt, as Mutex
		// waiters do.
		return rw.attempt(ctx, mode, tok, id, a.to.secret, queue, queue)
	}
	a.abandon = func(ctx context.Context) { rw.abandon(ctx, mode, tok, id) }
	g, start, err := rw.c.take(ctx, a, wait)
	if err == nil && g.kind == final {
		err = g.err
	}
	if err != nil || (g.kind != taken && g.kind != handed) {
		return false, err
	}
	if rw.cfg.replicas > 0 {
		spec := rw.renewSpec(mode, tok)
		if err := rw.c.replicated(ctx, &rw.cfg, spec.Script, spec.Keys, spec.Args...); err != nil {
			rw.c.cleanup(ctx, a.abandon)
			return false, err
		}
	}
	fence := g.fence
	if mode == modeRead {
		fence = 0
	}
	rw.held(mode, otok, tok, owned, fence, start, nil)
	return true, nil
}

// attempt runs the lock script once. starving makes a refused writer take
// a place in the writers' queue.
func (rw *RWMutex) attempt(ctx context.Context, mode, tok, id, secret string, wait, starving bool) (grant, error) {
	w, local, s := "0", "0", "0"
	if wait {
		w = "1"
	}
	if rw.cfg.local {
		local = "1"
	}
	if starving {
		s = "1"
	}
	r, err := rw.c.acquirePair(ctx, &rw.cfg, rwLock, rw.kargs, mode, tok, ms(rw.cfg.ttl), id, w, ms(fenceIdle), local, s, secret)
	code, v, err := pair("rwmutex lock", r, err)
	if err != nil {
		return grant{}, err
	}
	// Read holds carry no fencing token.
	if g, ok, err := decodeGrant(code, v, mode == modeWrite, "RWMutex "+strconv.Quote(rw.name)); ok {
		return g, err
	}
	if code == 4 {
		return grant{kind: final, err: ErrUpgrade}, nil
	}
	return grant{}, replyError("rwmutex lock", code)
}

// abandon undoes whatever a failed lock call may have done on the server.
func (rw *RWMutex) abandon(ctx context.Context, mode, tok, id string) {
	_ = rw.c.eval(ctx, rwUnlock, rw.kargs, mode, tok, newCallID(), rw.keys[0], ms(finishedKeep), id, "", ms(fenceIdle)).Err()
}

func (rw *RWMutex) holdKey(mode, tok string) holdKey {
	if mode == modeRead {
		return holdKey{rw.keys[2], tok}
	}
	return holdKey{rw.keys[0], tok}
}

// renewSpec describes the renewal of tok's hold in mode.
func (rw *RWMutex) renewSpec(mode, tok string) renew.Spec {
	if mode == modeRead {
		return renew.Spec{Script: rwRRenew, Batch: rwRRenews, Keys: rw.keys[2:4], Args: []any{tok, ms(rw.cfg.ttl)}}
	}
	return renew.Spec{Script: rwRenew, Batch: mutexRenews, Keys: rw.keys[:1], Args: []any{tok, ms(rw.cfg.ttl)}}
}

// held records a hold taken (or re-entered) by tok; q is the grant of a
// quorum hold, nil on one deployment.
func (rw *RWMutex) held(mode, otok, tok string, owned bool, fence uint64, start time.Time, q *answers) {
	newHold := func() *hold {
		if q != nil {
			return rw.quorumHold(mode, tok, fence, *q, start)
		}
		return rw.c.startHold(&rw.cfg, rw.renewSpec(mode, tok), tok, fence, start)
	}
	if owned {
		rw.c.ownerHold(rw.holdKey(mode, otok), fence, newHold)
		return
	}
	h := newHold()
	if mode == modeWrite {
		rw.slot.set(h)
		return
	}
	rw.mu.Lock()
	rw.reads = append(rw.reads, h)
	rw.mu.Unlock()
}

// takeRead removes the handle's latest read hold so that no other unlock
// releases it too.
func (rw *RWMutex) takeRead() *hold {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	n := len(rw.reads)
	if n == 0 {
		return nil
	}
	h := rw.reads[n-1]
	rw.reads[n-1] = nil
	rw.reads = rw.reads[:n-1]
	return h
}

// restoreRead gives back a read hold taken by takeRead whose unlock had an
// unknown outcome.
func (rw *RWMutex) restoreRead(h *hold) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	rw.reads = append(rw.reads, h)
}

// RUnlock releases one read hold: one level of an owner's re-entry, or the
// handle's most recent read hold. It does not affect other readers. It runs
// even if ctx is already done, detached with its own deadline. It returns
// [ErrNotHeld] if the caller holds no read lock on rw and [ErrLeaseLost] if
// the hold was lost before RUnlock; in both cases nothing is changed.
func (rw *RWMutex) RUnlock(ctx context.Context) error {
	return rw.unlock(ctx, modeRead)
}

// Unlock releases the write lock: one level of an owner's re-entry, or the
// handle's write hold. A read hold the owner took while writing (a
// downgrade) stays. On the last level every reader that waited for the
// writer becomes a holder. It runs even if ctx is already done, detached
// with its own deadline. It returns [ErrNotHeld] if the caller does not hold
// the write lock and [ErrLeaseLost] if the hold was lost before Unlock; in
// both cases nothing is changed.
func (rw *RWMutex) Unlock(ctx context.Context) error {
	return rw.unlock(ctx, modeWrite)
}

func (rw *RWMutex) unlock(ctx context.Context, mode string) error {
	if err := rw.check(); err != nil && !errors.Is(err, ErrClosed) {
		return err
	}
	otok, owned, err := owner(ctx)
	if err != nil {
		return err
	}
	var h *hold
	var tok string
	switch {
	case owned:
		if rw.cfg.local && rw.c.leave(rw.holdKey(mode, otok)) {
			// Client reentrancy: an inner unlock, counted in this process.
			return nil
		}
		h = rw.c.lookupHold(rw.holdKey(mode, otok))
		tok = rw.c.holderToken(&rw.cfg, otok)
	case mode == modeWrite:
		if h = rw.slot.get(); h == nil {
			return ErrNotHeld
		}
		tok = h.tok
	default:
		if h = rw.takeRead(); h == nil {
			return ErrNotHeld
		}
		tok = h.tok
	}
	id := newCallID()
	if h != nil {
		id = h.unlockCall()
	}
	restore := func() {
		if !owned && mode == modeRead {
			rw.restoreRead(h)
		}
	}
	forget := func() {
		if owned {
			rw.c.dropHold(rw.holdKey(mode, otok), h)
		} else if mode == modeWrite && rw.slot.clear(h) {
			rw.slot.leave()
		}
	}
	dctx, cancel := releaseContext(ctx)
	defer cancel()
	var r int64
	if rw.subs != nil {
		r, err = rw.quorumUnlock(dctx, mode, tok, id, h)
	} else {
		r, err = rw.c.eval(dctx, rwUnlock, rw.kargs, mode, tok, id, rw.keys[0], ms(finishedKeep), "", "", ms(fenceIdle)).Int64()
	}
	if err != nil {
		// The outcome is unknown: keep the hold, and let a retry reuse id.
		restore()
		return err
	}
	if h != nil {
		h.unlocked()
	}
	switch {
	case r == 1 || (r == 0 && h != nil):
		if h != nil {
			forget()
			if r == 0 {
				h.lease.MarkLost()
				h.releaseSubs()
				return ErrLeaseLost
			}
			h.releaseAll()
		}
		return nil
	case r == 2:
		if !owned {
			// A handle's holds have a count of one; still held.
			restore()
			return nil
		}
		if h != nil {
			rw.c.mu.Lock()
			h.count--
			last := h.count <= 0
			rw.c.mu.Unlock()
			if last {
				// Another process re-entered with this owner and renews
				// the rest of the hold.
				forget()
				h.releaseAll()
			}
		}
		return nil
	default:
		return ErrNotHeld
	}
}

// Lease returns the lease of the write hold of ctx's owner on rw or,
// without an owner in ctx, of the handle's write hold. It returns
// [ErrNotHeld] if there is none. It sends nothing to Redis.
func (rw *RWMutex) Lease(ctx context.Context) (*Lease, error) {
	return rw.lease(ctx, modeWrite)
}

// RLease returns the lease of the read hold of ctx's owner on rw or,
// without an owner in ctx, of the handle's most recent read hold. It returns
// [ErrNotHeld] if there is none. Its Token is 0: read holds carry no fencing
// token. It sends nothing to Redis.
func (rw *RWMutex) RLease(ctx context.Context) (*Lease, error) {
	return rw.lease(ctx, modeRead)
}

func (rw *RWMutex) lease(ctx context.Context, mode string) (*Lease, error) {
	if err := rw.check(); err != nil {
		return nil, err
	}
	tok, owned, err := owner(ctx)
	if err != nil {
		return nil, err
	}
	var h *hold
	if owned {
		h = rw.c.lookupHold(rw.holdKey(mode, tok))
	} else if mode == modeWrite {
		h = rw.slot.get()
	} else {
		rw.mu.Lock()
		if n := len(rw.reads); n > 0 {
			h = rw.reads[n-1]
		}
		rw.mu.Unlock()
	}
	if h == nil {
		return nil, ErrNotHeld
	}
	return h.leaseView(), nil
}
