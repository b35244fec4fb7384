package dsync

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

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
	keys []string // lock hash, fence hash, queue, queue data, call ids
	err  error

	// Script arguments boxed once per handle.
	kargs    []any // key count and keys
	ttlArg   any
	chanArg  any
	localArg any // '1' with client reentrancy

	subs []*Mutex // quorum mode: this handle on each member (see quorum.go)

	slot slot // the handle's own hold, without an owner in ctx
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
	m := &Mutex{c: c, name: name, slot: newSlot()}
	m.cfg, m.err = c.handleConfig(name, opts)
	k := m.cfg.keyOf(name)
	m.keys = []string{k, k + ":f", k + ":q", k + ":qd", k + ":x"}
	m.kargs = boxKeys(m.keys)
	m.ttlArg = ms(m.cfg.ttl)
	m.chanArg = k
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
	otok, owned, err := owner(ctx)
	if err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var tok string
	if owned {
		if m.cfg.local && m.c.reenter(holdKey{m.keys[0], otok}) {
			return true, nil
		}
		tok = m.c.holderToken(&m.cfg, otok)
	} else {
		// The handle is locked from Lock to Unlock, as a sync.Mutex is,
		// also when its hold was lost meanwhile.
		if ok, err := m.slot.enter(ctx, wait, m.c.closed); !ok || err != nil {
			return false, err
		}
		tok = newToken()
	}
	if m.subs != nil {
		return m.quorumLock(ctx, otok, tok, owned, wait)
	}
	id := newCallID()
	a := &acquisition{
		ch:  m.chanArg.(string),
		to:  newAddressee(tok, id),
		ttl: m.cfg.ttl,
	}
	a.attempt = func(ctx context.Context, queue bool) (grant, error) {
		return m.attempt(ctx, tok, id, a.to.secret, queue)
	}
	a.abandon = func(ctx context.Context) {
		_ = m.c.eval(ctx, mutexUnlock, m.kargs, tok, newCallID(), m.chanArg, fenceIdleArg, id, argNone, argNone).Err()
	}
	g, start, err := m.c.take(ctx, a, wait)
	if err == nil && g.kind == handed && m.cfg.replicas > 0 {
		// With WaitReplicas, make sure the hand-over reached replicas.
		if err = m.c.replicated(ctx, &m.cfg, mutexRenew, m.keys[:1], tok, m.ttlArg); err != nil {
			m.c.cleanup(ctx, a.abandon)
		}
	}
	if err == nil && g.kind == final {
		err = g.err
	}
	if err != nil || (g.kind != taken && g.kind != handed) {
		if !owned {
			m.slot.leave()
		}
		return false, err
	}
	m.held(otok, tok, owned, g.fence, start)
	return true, nil
}

// attempt runs the lock script once. With queue, a refused caller takes (or
// keeps) a place in the queue.
func (m *Mutex) attempt(ctx context.Context, tok, id, secret string, queue bool) (grant, error) {
	s := argNo
	if queue {
		s = argYes
	}
	r, err := m.c.acquirePair(ctx, &m.cfg, mutexLock, m.kargs, tok, m.ttlArg, id, s, fenceIdleArg, m.localArg, secret)
	code, v, err := pair("mutex lock", r, err)
	if err != nil {
		return grant{}, err
	}
	g, ok, err := decodeGrant(code, v, true, "Mutex "+strconv.Quote(m.name))
	if !ok {
		return grant{}, replyError("mutex lock", code)
	}
	return g, err
}

// held records a hold taken (or re-entered) by holder tok, for owner otok
// when owned.
func (m *Mutex) held(otok, tok string, owned bool, fence uint64, start time.Time) {
	newHold := func() *hold {
		return m.c.startHold(&m.cfg, renew.Spec{
			Script: mutexRenew,
			Batch:  mutexRenews,
			Keys:   m.keys[:1],
			Args:   []any{tok, m.ttlArg},
		}, tok, fence, start)
	}
	if owned {
		m.c.ownerHold(holdKey{m.keys[0], otok}, fence, newHold)
		return
	}
	m.slot.set(newHold())
}

// Unlock unlocks m: one level of an owner's re-entry, or the handle's hold.
// It runs even if ctx is already done, detached with its own deadline. It
// returns [ErrNotHeld] if the caller does not hold m and [ErrLeaseLost] if
// the hold was lost before Unlock; in both cases nothing is changed. Unlock
// never affects another owner's hold, nor a later hold of the same owner or
// handle, also when retried after a lost reply.
func (m *Mutex) Unlock(ctx context.Context) error {
	if err := m.check(); err != nil && !errors.Is(err, ErrClosed) {
		return err
	}
	if m.subs != nil {
		return m.quorumUnlock(ctx)
	}
	otok, owned, err := owner(ctx)
	if err != nil {
		return err
	}
	if owned && m.cfg.local && m.c.leave(holdKey{m.keys[0], otok}) {
		return nil
	}
	run := func(ctx context.Context, tok, id string, fence any) (int64, error) {
		return m.c.eval(ctx, mutexUnlock, m.kargs, tok, id, m.chanArg, fenceIdleArg, argNone, argNone, fence).Int64()
	}
	if owned {
		return m.c.unlockOwner(ctx, holdKey{m.keys[0], otok}, m.c.holderToken(&m.cfg, otok), run)
	}
	return m.c.unlockSlot(ctx, &m.slot, run)
}

// Lease returns the lease of the current hold of ctx's owner on m or,
// without an owner in ctx, of the handle's hold. It returns [ErrNotHeld] if
// there is none. It sends nothing to Redis.
func (m *Mutex) Lease(ctx context.Context) (*Lease, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	h, err := m.c.handleHold(ctx, m.keys[0], &m.slot)
	if err != nil {
		return nil, err
	}
	return h.leaseView(), nil
}
