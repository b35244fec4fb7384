package dsync

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dsync-go/dsync/internal/keys"
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

	mu    sync.Mutex
	w     *hold   // the handle's write hold, without an owner in ctx
	reads []*hold // the handle's read holds, without an owner, latest last
}

// RWMutex returns a handle on the RWMutex called name. Options override the
// Client's defaults for this handle. An empty name or a bad option makes
// every call on the handle fail with [ErrInvalid]. An RWMutex and a [Mutex]
// of the same name are distinct locks.
func (c *Client) RWMutex(name string, opts ...Option) *RWMutex {
	rw := &RWMutex{c: c, name: name}
	rw.cfg, rw.err = c.handleConfig(name, opts)
	rw.keys = keys.ForRWMutex(rw.cfg.prefix, name).Keys()
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
	tok, owned, err := owner(ctx)
	if err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if owned && rw.cfg.local && rw.c.reenter(rw.holdKey(mode, tok)) {
		// Client reentrancy: the owner holds rw in mode through this
		// process, which counts the re-entry without a round trip.
		return true, nil
	}
	if !owned {
		tok = newToken()
	}
	if rw.subs != nil {
		return rw.quorumLock(ctx, mode, tok, owned, wait)
	}
	id := newCallID()
	var mk mark
	if wait {
		mk = rw.c.notify.mark(rw.keys[0])
	}
	start := time.Now()
	v, err := rw.attempt(ctx, mode, tok, id, wait, false)
	if err == nil && v < 0 && wait {
		v, start, err = rw.wait(ctx, mode, tok, id, start, v, mk)
	}
	if err != nil {
		rw.abandon(ctx, mode, tok, id)
		return false, err
	}
	switch {
	case v == 0:
		// The script dropped the caller's place, if it had one.
		return false, ErrUpgrade
	case v < 0:
		return false, nil
	}
	if rw.cfg.replicas > 0 {
		// With WaitReplicas, make sure the hold reached the replicas.
		spec := rw.renewSpec(mode, tok)
		if err := rw.c.replicated(ctx, &rw.cfg, spec.Script, spec.Keys, spec.Args...); err != nil {
			rw.abandon(ctx, mode, tok, id)
			return false, err
		}
	}
	fence := uint64(v)
	if mode == modeRead {
		fence = 0
	}
	rw.held(mode, tok, owned, fence, start, nil)
	return true, nil
}

// attempt runs the lock script once: > 0 held (the fencing token of a write
// hold), 0 an upgrade refused, < 0 minus the ms to wait at most. A waiting
// writer that is starving queues if refused.
func (rw *RWMutex) attempt(ctx context.Context, mode, tok, id string, wait, starving bool) (int64, error) {
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
	return rw.c.eval(ctx, rwLock, rw.kargs, mode, tok, ms(rw.cfg.ttl), id, w, ms(fenceIdle), local, s).Int64()
}

// wait retries after notifications until the lock is held, refused as an
// upgrade, or ctx is done. The call's first attempt, sent at start after
// mk, replied v. A writer that has waited past the starvation threshold queues, and may
// be handed the lock by a release: the notification names its call, which
// then holds the lock without another attempt. With a hold, wait also
// returns a time no later than the start of its lease: the send time of the
// last refused attempt, since a release may have granted the hold (or
// handed it over) after it.
func (rw *RWMutex) wait(ctx context.Context, mode, tok, id string, start time.Time, v int64, mk mark) (int64, time.Time, error) {
	// A hand-over names the lock call, not only the owner: two calls of one
	// owner may wait at once. Unless the channel was subscribed before the
	// first attempt and delivered nothing for this call since, a release
	// may have been missed: try again once subscribed.
	w, retry := rw.c.notify.watchSince(rw.keys[0], tok+" "+id, mk)
	defer rw.c.notify.unwatch(w)
	w.awaitReady(ctx, rw.c.closed)
	t := time.NewTimer(rw.sleepFor(v))
	defer t.Stop()
	sent := start
	for {
		if retry {
			now := time.Now()
			v, err := rw.attempt(ctx, mode, tok, id, true, now.Sub(start) >= starvation)
			if err != nil || v >= 0 {
				return v, sent, err
			}
			sent = now
			t.Reset(rw.sleepFor(v))
		}
		select {
		case <-ctx.Done():
			return 0, sent, ctx.Err()
		case <-rw.c.closed:
			return 0, sent, ErrClosed
		case <-t.C:
			retry = true
		case <-w.sig:
			if f, ok := w.handover(); ok {
				return int64(f), sent, nil
			}
			// A plain release (or a resubscription) invites a retry; the
			// timer set after the last attempt keeps running otherwise.
			retry = w.shouldRetry()
		}
	}
}

// sleepFor is how long a waiter sleeps at most after an attempt that
// returned v < 0: no longer than the blocking hold (or writer's place) can
// last, and so that the caller's own place is refreshed within its TTL.
func (rw *RWMutex) sleepFor(v int64) time.Duration {
	d := min(time.Duration(-v)*time.Millisecond, rw.cfg.ttl/2)
	return max(d, time.Millisecond)
}

// abandon undoes whatever a failed lock call may have done on the server: a
// hold it took (or was granted) whose reply was lost, a re-entry, its
// waiting place. It runs detached from ctx, which may be done.
func (rw *RWMutex) abandon(ctx context.Context, mode, tok, id string) {
	dctx, cancel := detached(ctx)
	defer cancel()
	_ = rw.c.eval(dctx, rwUnlock, rw.kargs, mode, tok, newCallID(), rw.keys[0], ms(finishedKeep), id, "", ms(fenceIdle)).Err()
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
func (rw *RWMutex) held(mode, tok string, owned bool, fence uint64, start time.Time, q *answers) {
	newHold := func() *hold {
		if q != nil {
			return rw.quorumHold(mode, tok, fence, *q, start)
		}
		return rw.c.startHold(&rw.cfg, rw.renewSpec(mode, tok), tok, fence, start)
	}
	if owned {
		rw.c.ownerHold(rw.holdKey(mode, tok), fence, newHold)
		return
	}
	h := newHold()
	rw.mu.Lock()
	if mode == modeRead {
		rw.reads = append(rw.reads, h)
		rw.mu.Unlock()
		return
	}
	old := rw.w
	rw.w = h
	rw.mu.Unlock()
	if old != nil {
		// The previous write hold of this handle is gone, or Lock would
		// have waited.
		old.releaseAll()
	}
}

// take removes the handle's hold in mode (the latest read hold) so that no
// other unlock releases it too.
func (rw *RWMutex) take(mode string) *hold {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if mode == modeWrite {
		h := rw.w
		rw.w = nil
		return h
	}
	n := len(rw.reads)
	if n == 0 {
		return nil
	}
	h := rw.reads[n-1]
	rw.reads[n-1] = nil
	rw.reads = rw.reads[:n-1]
	return h
}

// restore gives back a hold taken by take whose unlock had an unknown outcome.
func (rw *RWMutex) restore(mode string, h *hold) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if mode == modeRead {
		rw.reads = append(rw.reads, h)
	} else if rw.w == nil {
		rw.w = h
	}
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
	tok, owned, err := owner(ctx)
	if err != nil {
		return err
	}
	var h *hold
	if owned {
		if rw.cfg.local && rw.c.leave(rw.holdKey(mode, tok)) {
			// Client reentrancy: an inner unlock, counted in this process.
			return nil
		}
		h = rw.c.lookupHold(rw.holdKey(mode, tok))
	} else {
		if h = rw.take(mode); h == nil {
			return ErrNotHeld
		}
		tok = h.tok
	}
	id := newCallID()
	if h != nil {
		rw.mu.Lock()
		if h.unlockID != "" {
			id = h.unlockID
		}
		h.unlockID = id
		rw.mu.Unlock()
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
		if !owned {
			rw.restore(mode, h)
		}
		return err
	}
	if h != nil {
		rw.mu.Lock()
		h.unlockID = ""
		rw.mu.Unlock()
	}
	switch {
	case r == 1 || (r == 0 && h != nil):
		if h != nil {
			if owned {
				rw.c.dropHold(rw.holdKey(mode, tok), h)
			}
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
			rw.restore(mode, h)
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
				rw.c.dropHold(rw.holdKey(mode, tok), h)
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
	} else {
		rw.mu.Lock()
		if mode == modeWrite {
			h = rw.w
		} else if n := len(rw.reads); n > 0 {
			h = rw.reads[n-1]
		}
		rw.mu.Unlock()
	}
	if h == nil {
		return nil, ErrNotHeld
	}
	return h.leaseView(), nil
}
