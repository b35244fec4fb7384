package dsync

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/renew"
)

// A Mutex is a mutual exclusion lock shared by every process that names it,
// the distributed twin of [sync.Mutex]. Get one with [Client.Mutex] (or,
// over several independent masters, [Quorum.Mutex]); a Mutex handle is safe
// for concurrent use and cheap, so make one where needed.
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
	// The Client's or Quorum's closed state and owners' holds; nil if
	// the handle was made by a nil one.
	b    *base
	impl mutexImpl // takes and releases the holds
	cfg  config
	key  string // the lock hash: owners' holds are recorded under it
	err  error

	slot slot // the handle's own hold, without an owner in ctx
}

// A mutexImpl takes and releases the holds of a Mutex: on one deployment
// (mutexScripts, below) or on a quorum of masters (quorumMutex in
// quorum_mutex.go). The Mutex methods do the rest, the same in both modes:
// argument checks, owners, the handle's slot, re-entry counts and leases.
type mutexImpl interface {
	// lock makes the attempts of one Lock (wait) or TryLock call for
	// holder c.tok and, if it takes the hold, records it with m.held. It
	// reports whether it did; on an error it leaves no hold behind.
	lock(ctx context.Context, m *Mutex, c lockCall, wait bool) (bool, error)
	// unlock is the Mutex's releaser.
	unlock(ctx context.Context, tok, id string, h *hold) (int64, error)
}

// A lockCall is one lock call's holder: owner otok when owned, otherwise
// the handle; tok is the holder token the scripts see.
type lockCall struct {
	otok, tok string
	owned     bool
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
	m, k := newMutex(c.shared(), name, opts)
	m.impl = newMutexScripts(c, &m.cfg, k, name)
	return m
}

// newMutex returns a handle, without its impl, on the Mutex called name
// made through b, and the Mutex's keys.
func newMutex(b *base, name string, opts []Option) (*Mutex, keys.Mutex) {
	m := &Mutex{b: b, slot: newSlot()}
	m.cfg, m.err = b.handleConfig(name, opts)
	k := keys.ForMutex(m.cfg.prefix, name)
	m.key = k.Lock
	return m, k
}

func (m *Mutex) check() error {
	if m == nil {
		return fmt.Errorf("%w: nil Mutex", ErrInvalid)
	}
	if err := m.b.check(); err != nil {
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
	c := lockCall{otok: otok, owned: owned}
	if owned {
		if m.cfg.local && m.b.reenter(holdKey{m.key, otok}) {
			return true, nil
		}
		c.tok = m.b.holderToken(&m.cfg, otok)
	} else {
		// The handle is locked from Lock to Unlock, as a sync.Mutex is,
		// also when its hold was lost meanwhile.
		if ok, err := m.slot.enter(ctx, wait, m.b.closed); !ok || err != nil {
			return false, err
		}
		c.tok = newToken()
	}
	ok, err := m.impl.lock(ctx, m, c, wait)
	if !ok && !owned {
		m.slot.leave()
	}
	return ok, err
}

// held records a hold taken (or re-entered) by call c with fencing token
// fence; newHold starts the lease of a hold that is not a re-entry.
func (m *Mutex) held(c lockCall, fence uint64, newHold func() *hold) {
	if c.owned {
		m.b.ownerHold(holdKey{m.key, c.otok}, fence, newHold)
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
	otok, owned, err := owner(ctx)
	if err != nil {
		return err
	}
	if owned && m.cfg.local && m.b.leave(holdKey{m.key, otok}) {
		return nil
	}
	if owned {
		return m.b.unlockOwner(ctx, holdKey{m.key, otok}, m.b.holderToken(&m.cfg, otok), m.impl.unlock)
	}
	return m.b.unlockSlot(ctx, &m.slot, m.impl.unlock)
}

// Lease returns the lease of the current hold of ctx's owner on m or,
// without an owner in ctx, of the handle's hold. It returns [ErrNotHeld] if
// there is none. It sends nothing to Redis.
func (m *Mutex) Lease(ctx context.Context) (*Lease, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	h, err := m.b.handleHold(ctx, m.key, &m.slot)
	if err != nil {
		return nil, err
	}
	return h.leaseView(), nil
}

// mutexScripts is a Mutex on one deployment: its scripts run on the
// Client's Redis, and its calls wait through the Client's engine. A
// quorumMutex runs one per master.
type mutexScripts struct {
	c    *Client
	cfg  *config
	keys []string // lock hash, fence hash, queue, queue data, call ids

	// Script arguments boxed once per handle.
	kargs    []any // key count and keys
	ttlArg   any
	chanArg  any
	localArg any    // '1' with client reentrancy
	what     string // how errors name the Mutex
}

func newMutexScripts(c *Client, cfg *config, k keys.Mutex, name string) *mutexScripts {
	s := &mutexScripts{c: c, cfg: cfg, keys: k.Keys(), chanArg: k.Channel(), localArg: argNo}
	s.kargs = boxKeys(s.keys)
	s.ttlArg = ms(cfg.ttl)
	s.what = "Mutex " + strconv.Quote(name)
	if cfg.local {
		s.localArg = argYes
	}
	return s
}

// lock takes the hold through the engine (see mutexImpl).
func (s *mutexScripts) lock(ctx context.Context, m *Mutex, c lockCall, wait bool) (bool, error) {
	tok, id := c.tok, newCallID()
	a := &acquisition{
		ch:  s.chanArg.(string),
		to:  newAddressee(tok, id),
		ttl: s.cfg.ttl,
	}
	a.attempt = func(ctx context.Context, queue bool) (grant, error) {
		return s.attempt(ctx, tok, id, a.to.secret, queue)
	}
	a.abandon = func(ctx context.Context) { s.abandon(ctx, tok, id) }
	g, start, err := s.c.take(ctx, a, wait)
	if err == nil && g.kind == handed && s.cfg.replicas > 0 {
		// With WaitReplicas, make sure the hand-over reached replicas.
		if err = s.c.replicated(ctx, s.cfg, mutexRenew, s.keys[:1], tok, s.ttlArg); err != nil {
			s.c.cleanup(ctx, a.abandon)
		}
	}
	if err == nil && g.kind == final {
		err = g.err
	}
	if err != nil || (g.kind != taken && g.kind != handed) {
		return false, err
	}
	m.held(c, g.fence, func() *hold {
		return s.c.startHold(s.cfg, s.renewSpec(tok), tok, g.fence, start)
	})
	return true, nil
}

// attempt runs the lock script once. With queue, a refused caller takes (or
// keeps) a place in the queue.
func (s *mutexScripts) attempt(ctx context.Context, tok, id, secret string, queue bool) (grant, error) {
	q := argNo
	if queue {
		q = argYes
	}
	r, err := s.c.acquirePair(ctx, s.cfg, mutexLock, s.kargs, tok, s.ttlArg, id, q, fenceIdleArg, s.localArg, secret)
	code, v, err := pair("mutex lock", r, err)
	if err != nil {
		return grant{}, err
	}
	g, ok, err := decodeGrant(code, v, true, s.what)
	if !ok {
		return grant{}, replyError("mutex lock", code)
	}
	return g, err
}

// abandon undoes whatever the lock call id of tok may have done.
func (s *mutexScripts) abandon(ctx context.Context, tok, id string) {
	_ = s.c.eval(ctx, mutexUnlock, s.kargs, tok, newCallID(), s.chanArg, fenceIdleArg, id, argNone, argNone).Err()
}

// unlock runs the unlock script, naming the hold h ends.
func (s *mutexScripts) unlock(ctx context.Context, tok, id string, h *hold) (int64, error) {
	return s.unlockFloor(ctx, tok, id, argNone, h.fenceArg())
}

// unlockFloor runs the unlock script for holder tok with call id; floor,
// if set, raises the fencing counter to it, and fence, if set, names the
// hold the unlock ends.
func (s *mutexScripts) unlockFloor(ctx context.Context, tok, id string, floor, fence any) (int64, error) {
	return s.c.eval(ctx, mutexUnlock, s.kargs, tok, id, s.chanArg, fenceIdleArg, argNone, floor, fence).Int64()
}

// renewSpec describes the renewal of tok's hold.
func (s *mutexScripts) renewSpec(tok string) renew.Spec {
	return renew.Spec{Script: mutexRenew, Batch: mutexRenews, Keys: s.keys[:1], Args: []any{tok, s.ttlArg}}
}
