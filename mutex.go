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

// A Mutex is a mutual exclusion lock shared by every process that names it,
// the distributed twin of [sync.Mutex]. Get one with [Client.Mutex]; a Mutex
// handle is safe for concurrent use and cheap, so make one where needed.
//
// Without an owner in ctx a Mutex handle behaves like sync.Mutex: it is not
// reentrant, it remembers the hold it took, and any goroutine using the
// handle may unlock it. With an owner (see [WithOwner]) the owner may lock
// again while it holds the lock (each Lock needs one Unlock), other owners
// wait, and only the owner may unlock.
//
// Unlike sync.Mutex, every hold has a lease (see [TTL]): the Client renews it
// while the hold lives, and a holder that dies frees the lock when its lease
// runs out. Each fresh acquisition gets a fencing token larger than every
// earlier one of the name ([Lease.Token]).
//
// Waiters are woken by the release, not by polling. As in sync.Mutex's
// starvation mode (here from the first refused attempt on), a waiter takes
// a place in a queue kept in Redis; newcomers, including the goroutine that
// just unlocked, then queue behind it, and an unlock hands the lock straight
// to the first in line, which owns it without another round trip. TryLock
// never queues.
type Mutex struct {
	c    *Client
	cfg  config
	name string
	keys []string // lock hash, fence hash, queue, queue data
	err  error

	// Script arguments boxed once per handle.
	kargs    []any // key count and keys
	ttlArg   any
	chanArg  any
	localArg any // '1' with client reentrancy

	subs []*Mutex // quorum mode: this handle on each member (see quorum.go)

	mu  sync.Mutex
	cur *hold // the handle's own hold, without an owner in ctx
}

var (
	fenceIdleArg any = ms(fenceIdle)
	argNo        any = "0"
	argYes       any = "1"
	argNone      any = ""
)

// Mutex returns a handle on the Mutex called name. Options override the
// Client's defaults for this handle. An empty name or a bad option makes
// every call on the handle fail with [ErrInvalid].
func (c *Client) Mutex(name string, opts ...Option) *Mutex {
	m := &Mutex{c: c, name: name}
	m.cfg, m.err = c.handleConfig(name, opts)
	k := keys.ForMutex(m.cfg.prefix, name)
	m.keys = k.Keys()
	m.kargs = boxKeys(m.keys)
	m.ttlArg = ms(m.cfg.ttl)
	m.chanArg = k.Channel()
	m.localArg = argNo
	if m.cfg.local {
		m.localArg = argYes
	}
	if c != nil && c.q != nil {
		m.subs = c.q.mutexes(name, opts)
	}
	return m
}

func (m *Mutex) check() error {
	if m == nil {
		return fmt.Errorf("%w: nil Mutex", ErrInvalid)
	}
	if err := m.c.check(); err != nil {
		return err
	}
	return m.err
}

// Lock locks m, waiting until it is free or ctx is done. On success the
// hold lasts until Unlock, renewed by the Client; with an owner in ctx that
// already holds m, Lock re-enters at once. On failure it returns an error
// for which errors.Is(err, ctx.Err()) holds (or a Redis or [ErrClosed]
// error) and leaves no hold behind, also when the server took the lock but
// the reply was lost.
func (m *Mutex) Lock(ctx context.Context) error {
	_, err := m.lock(ctx, true)
	return err
}

// TryLock tries to lock m once, without waiting, and reports whether it
// succeeded. It fails if another owner holds m or waiters are queued for it.
// An error means the attempt could not be made or its outcome is unknown;
// then no hold is left behind.
func (m *Mutex) TryLock(ctx context.Context) (bool, error) {
	return m.lock(ctx, false)
}

func (m *Mutex) lock(ctx context.Context, wait bool) (bool, error) {
	if err := m.check(); err != nil {
		return false, err
	}
	if m.subs != nil {
		return m.quorumLock(ctx, wait)
	}
	tok, owned, err := owner(ctx)
	if err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var id string
	if owned {
		if m.cfg.local && m.c.reenter(holdKey{m.keys[0], tok}) {
			return true, nil
		}
		id = newCallID()
	} else {
		// A fresh token per call is also a fine call id.
		tok = newToken()
		id = tok
	}
	var mk mark
	if wait {
		mk = m.c.notify.mark(m.keys[0])
	}
	start := time.Now()
	v, err := m.attempt(ctx, tok, id, wait)
	if err != nil {
		m.abandon(ctx, tok, id)
		return false, err
	}
	if v <= 0 && wait {
		// The lease of a hold taken (or handed over) while waiting began
		// after the last attempt was sent.
		v, start, err = m.wait(ctx, tok, id, start, v, mk)
		if err != nil {
			m.abandon(ctx, tok, id)
			return false, err
		}
	}
	if v <= 0 {
		return false, nil
	}
	m.held(tok, owned, uint64(v), start)
	return true, nil
}

// attempt runs the lock script once: > 0 is the fencing token of a hold,
// ≤ 0 minus the ms to wait at most. With queue, a refused caller takes (or
// keeps) a place in the queue.
func (m *Mutex) attempt(ctx context.Context, tok, id string, queue bool) (int64, error) {
	s := argNo
	if queue {
		s = argYes
	}
	return m.c.acquire(ctx, &m.cfg, mutexLock, m.kargs, tok, m.ttlArg, id, s, fenceIdleArg, m.localArg)
}

// wait retries after notifications until the lock is held or ctx is done.
// The first attempt, which returned v, was sent at start, after mk.
func (m *Mutex) wait(ctx context.Context, tok, id string, start time.Time, v int64, mk mark) (int64, time.Time, error) {
	// Unless the name's channel was subscribed before the first attempt
	// and has delivered nothing for this waiter since, a release may have
	// been missed: try again once subscribed.
	w, retry := m.c.notify.watchSince(m.keys[0], tok, mk)
	defer m.c.notify.unwatch(w)
	w.awaitReady(ctx, m.c.closed)
	t := time.NewTimer(m.sleepFor(v))
	defer t.Stop()
	sent := start
	for {
		if retry {
			var err error
			sent = time.Now()
			v, err = m.attempt(ctx, tok, id, true)
			if err != nil || v > 0 {
				return v, sent, err
			}
			t.Reset(m.sleepFor(v))
		}
		select {
		case <-ctx.Done():
			return 0, sent, ctx.Err()
		case <-m.c.closed:
			return 0, sent, ErrClosed
		case <-t.C:
			retry = true
		case <-w.sig:
			if f, ok := w.handover(); ok {
				// With WaitReplicas, make sure the hand-over reached replicas.
				err := m.c.replicated(ctx, &m.cfg, mutexRenew, m.keys[:1], tok, m.ttlArg)
				return int64(f), sent, err
			}
			// A plain release (or a resubscription) invites a retry; a
			// hand-over to another waiter does not, and the timer set
			// after the last attempt keeps running.
			retry = w.shouldRetry()
		}
	}
}

// sleepFor is how long a waiter sleeps at most after an attempt that
// returned v ≤ 0: no longer than the hold (or the queue place) can last,
// and so that the queue place is refreshed within its TTL.
func (m *Mutex) sleepFor(v int64) time.Duration {
	d := min(time.Duration(-v)*time.Millisecond, m.cfg.ttl/2)
	return max(d, time.Millisecond)
}

// abandon undoes whatever a failed Lock call may have done on the server:
// a hold it took whose reply was lost, a re-entry, its place in the queue.
// It runs detached from ctx, which may be done.
func (m *Mutex) abandon(ctx context.Context, tok, id string) {
	dctx, cancel := detached(ctx)
	defer cancel()
	_ = m.c.eval(dctx, mutexUnlock, m.kargs, tok, newCallID(), m.chanArg, fenceIdleArg, id).Err()
}

// held records a hold taken (or re-entered) by tok.
func (m *Mutex) held(tok string, owned bool, fence uint64, start time.Time) {
	newHold := func() *hold {
		return m.c.startHold(&m.cfg, renew.Spec{
			Script: mutexRenew,
			Batch:  mutexRenews,
			Keys:   m.keys[:1],
			Args:   []any{tok, m.ttlArg},
		}, tok, fence, start)
	}
	if owned {
		m.c.ownerHold(holdKey{m.keys[0], tok}, fence, newHold)
		return
	}
	h := newHold()
	m.mu.Lock()
	old := m.cur
	m.cur = h
	m.mu.Unlock()
	if old != nil {
		// The previous hold of this handle is gone, or Lock would have waited.
		old.release()
	}
}

// Unlock unlocks m: one level of an owner's re-entry, or the handle's hold.
// It runs even if ctx is already done, detached with its own deadline. It
// returns [ErrNotHeld] if the caller does not hold m and [ErrLeaseLost] if
// the hold was lost before Unlock; in both cases nothing is changed. Unlock
// never affects another owner's hold, also when retried after a lost reply.
func (m *Mutex) Unlock(ctx context.Context) error {
	if err := m.check(); err != nil && !errors.Is(err, ErrClosed) {
		return err
	}
	if m.subs != nil {
		return m.quorumUnlock(ctx)
	}
	tok, owned, h, id, done, err := m.unlockTarget(ctx)
	if done || err != nil {
		return err
	}
	dctx, cancel := releaseContext(ctx)
	defer cancel()
	r, err := m.c.eval(dctx, mutexUnlock, m.kargs, tok, id, m.chanArg, fenceIdleArg, argNone).Int64()
	if err != nil {
		// The outcome is unknown: keep the hold, and let a retry reuse id.
		return err
	}
	if h != nil {
		m.mu.Lock()
		h.unlockID = ""
		m.mu.Unlock()
	}
	switch {
	case r == 1 || (r == 0 && h != nil):
		if h != nil {
			m.forget(owned, tok, h)
			if r == 0 {
				h.lease.MarkLost()
				return ErrLeaseLost
			}
			h.release()
		}
		return nil
	case r == 2:
		if h != nil && owned {
			m.c.mu.Lock()
			h.count--
			last := h.count <= 0
			m.c.mu.Unlock()
			if last {
				// Another process re-entered with this owner and renews
				// the rest of the hold.
				m.forget(owned, tok, h)
				h.release()
			}
		}
		return nil
	default:
		return ErrNotHeld
	}
}

// unlockTarget finds what an Unlock with ctx releases: the owner's token
// and this process's record of its hold (nil if another process took it),
// or the handle's hold; and the call id, reused from an earlier Unlock whose
// reply was lost. done reports an inner unlock of client reentrancy, which
// needs no round trip.
func (m *Mutex) unlockTarget(ctx context.Context) (tok string, owned bool, h *hold, id string, done bool, err error) {
	tok, owned, err = owner(ctx)
	if err != nil {
		return "", false, nil, "", false, err
	}
	if owned {
		if m.cfg.local && m.c.leave(holdKey{m.keys[0], tok}) {
			return "", false, nil, "", true, nil
		}
		h = m.c.lookupHold(holdKey{m.keys[0], tok})
	} else {
		m.mu.Lock()
		h = m.cur
		m.mu.Unlock()
		if h == nil {
			return "", false, nil, "", false, ErrNotHeld
		}
		tok = h.tok
	}
	id = newCallID()
	if h != nil {
		m.mu.Lock()
		if h.unlockID != "" {
			id = h.unlockID
		}
		h.unlockID = id
		m.mu.Unlock()
	}
	return tok, owned, h, id, false, nil
}

func (m *Mutex) forget(owned bool, tok string, h *hold) {
	m.c.forgetHold(m.keys[0], owned, tok, h, &m.mu, &m.cur)
}

// Lease returns the lease of the current hold of ctx's owner on m or,
// without an owner in ctx, of the handle's hold. It returns [ErrNotHeld] if
// there is none. It sends nothing to Redis.
func (m *Mutex) Lease(ctx context.Context) (*Lease, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	h, err := m.c.handleHold(ctx, m.keys[0], &m.mu, &m.cur)
	if err != nil {
		return nil, err
	}
	return h.leaseView(), nil
}
