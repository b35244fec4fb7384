package dsync

import (
	"context"
	"fmt"

	"github.com/dsync-go/dsync/internal/keys"
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
// to the first in line, which owns it without another round trip (one whose
// TTL is below 200 ms is instead left first in line and woken, and takes
// the lock with its own attempt: a hold handed over lasts the waiter's TTL
// from the release, which a waiter slow to run could miss). TryLock never
// queues. Lock calls without an owner that wait while another call of
// the same Client holds the name (or tries for it) wait in the process, in
// arrival order, and the release passes the lock to the first of them in
// its own round trip (with a new fencing token); while other processes are
// queued, at most 8 times in a row before the first of those gets it.
type Mutex struct {
	handle           // the Client's or Quorum's base, configuration, bad input
	impl   mutexImpl // takes and releases the holds
	key    string    // the lock hash: owners' holds are recorded under it

	slot slot // the handle's own hold, without an owner in ctx
}

// A mutexImpl takes and releases the holds of a Mutex: on one deployment
// (mutexScripts, mutex_scripts.go) or on a quorum of masters (quorumMutex in
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
	// Under client reentrancy, the call's watch and the releases it saw
	// (see base.lockLocal); nil otherwise.
	w   *callWatch
	rel uint64
	// ordered: the call's grants carry fencing tokens of one deployment,
	// which rise for a holder (a Mutex or write lock not in quorum mode;
	// see errSuperseded).
	ordered bool
}

var (
	fenceIdleArg any = ms(fenceIdle)
	argNo        any = "0"
	argYes       any = "1"
	argNone      any = ""
)

// flagArg returns argYes for true, argNo for false.
func flagArg(b bool) any {
	if b {
		return argYes
	}
	return argNo
}

// Mutex returns a handle on the Mutex called name. Options override the
// Client's defaults for this handle. An empty name or a bad option makes
// every call on the handle fail with [ErrInvalid].
func (c *Client) Mutex(name string, opts ...Option) *Mutex {
	m, k := newMutex(c.shared(), name, opts)
	s := newMutexScripts(c, &m.cfg, k, name)
	if m.cfg.replicas == 0 && c != nil {
		s.co = &c.cohorts
	}
	m.impl = s
	return m
}

// newMutex returns a handle, without its impl, on the Mutex called name
// made through b, and the Mutex's keys.
func newMutex(b *base, name string, opts []Option) (*Mutex, keys.Mutex) {
	m := &Mutex{handle: b.newHandle(name, opts), slot: newSlot()}
	k := keys.ForMutex(m.cfg.prefix, name)
	m.key = k.Lock
	return m, k
}

func (m *Mutex) check() error {
	if m == nil {
		return fmt.Errorf("%w: nil Mutex", ErrInvalid)
	}
	return m.handle.check()
}

// Lock locks m, waiting until it is free or ctx is done. On success the
// hold lasts until Unlock, renewed by the Client; with an owner in ctx that
// already holds m, Lock re-enters at once. On failure it returns an error
// for which errors.Is(err, ctx.Err()) holds (or a Redis or [ErrClosed]
// error) and leaves no hold behind, also when the server took the lock but
// the reply was lost (unless Redis stays unreachable for more than 5 s:
// see the package documentation).
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
	return m.b.lockThrough(ctx, &m.cfg, m.key, &m.slot, wait, func(c lockCall) (bool, error) {
		return m.impl.lock(ctx, m, c, wait)
	})
}

// held records a hold taken (or re-entered) by call c with fencing token
// fence; newHold starts the lease of a hold that is not a re-entry. An
// error (errRegrant, errSuperseded) means it recorded nothing: the caller
// undoes the call.
func (m *Mutex) held(c lockCall, fence uint64, newHold func() *hold) (*hold, error) {
	if c.owned {
		return m.b.ownerHold(holdKey{m.key, c.otok}, fence, newHold, c)
	}
	h := newHold()
	m.slot.set(h)
	return h, nil
}

// Unlock unlocks m: one level of an owner's re-entry, or the handle's hold.
// It runs even if ctx is already done; if ctx ends before its outcome is
// known (or, already done, the outcome does not come within a few ms),
// Unlock returns ctx's error then and the release completes in the
// background, as if the caller had waited (it is not to be repeated). It
// returns [ErrNotHeld] if the caller does not hold m and [ErrLeaseLost] if
// the hold was lost before Unlock; in both cases nothing is changed. After
// a Redis error, its ctx still open, the outcome is unknown and the level
// still counts: repeat the Unlock. The repeat is sent under the first
// one's call id, naming its hold, and answers as it would have, also when
// another goroutine of the owner locked in between, if it comes within
// the replay window (60 s from the first one's run); a later one is a new
// Unlock of the hold it names, which may end the hold (its Lease then
// ends, and a further Unlock returns [ErrNotHeld]). Unlock never affects
// another owner's hold, and an Unlock retried after a lost reply never
// affects a later hold of the same owner or handle. The
// goroutines acting for one owner share its levels: once the owner holds
// again after a loss, an Unlock by any of them ends a level of the new
// hold, also one meant for a level of the lost hold. An owner's Unlock
// made while it holds nothing in the Client, for a level of a hold that
// ended there, names that hold and never ends a later one, however late
// it arrives. One that ends the hold a Lock of the owner in flight was
// granted, before that Lock learned of it, ends that Lock's level: the
// Lock takes the lock again, and returns with a hold Redis has.
func (m *Mutex) Unlock(ctx context.Context) error {
	if err := m.check(); err != nil {
		return err
	}
	otok, owned, err := owner(ctx)
	if err != nil {
		return err
	}
	if owned {
		k := holdKey{m.key, otok}
		if err := m.b.otherMode(otok, m.b.holderToken(&m.cfg, otok), m.key); err != nil {
			return err
		}
		var h *hold
		busy := false
		if m.cfg.local {
			var inner bool
			if h, inner, busy = m.b.leaveLocal(k, false); inner {
				return nil
			}
		}
		return settle(m.b, ctx, mutexRelease{m, k, otok, h, busy}, mutexOwnerSettler)
	}
	return settle(m.b, ctx, mutexRelease{m: m}, mutexHandleSettler)
}

var (
	mutexOwnerSettler  = &settler[mutexRelease]{f: releaseMutexOwner}
	mutexHandleSettler = &settler[mutexRelease]{f: releaseMutexHandle}
)

// releaseMutexHandle ends the hold of the handle r.m.
func releaseMutexHandle(ctx context.Context, r mutexRelease) error {
	return r.m.b.unlockSlot(ctx, &r.m.slot, r.m.impl.unlock)
}

// mutexRelease is what an Unlock of m releases: a level of the hold of
// owner otok recorded under k (h under client reentrancy: the hold of its
// last level, or with busy, a release of it was under way and the level
// is counted once that is over), or the handle's hold.
type mutexRelease struct {
	m    *Mutex
	k    holdKey
	otok string
	h    *hold
	busy bool
}

// releaseMutexOwner is Unlock for an owner, on a ctx from settle.
func releaseMutexOwner(ctx context.Context, r mutexRelease) error {
	m := r.m
	if m.cfg.local {
		if r.busy {
			var inner bool
			if r.h, inner, _ = m.b.leaveLocal(r.k, true); inner {
				return nil
			}
		}
		// Lock calls of the owner wait until the release is over.
		defer m.b.endRelease(r.h)
	}
	return m.b.unlockOwner(ctx, r.k, m.b.holderToken(&m.cfg, r.otok), m.impl.unlock, m.cfg.local, r.h)
}

// Lease returns the lease of the current hold of ctx's owner on m or,
// without an owner in ctx, of the handle's hold. It returns [ErrNotHeld] if
// there is none. It sends nothing to Redis.
func (m *Mutex) Lease(ctx context.Context) (*Lease, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	return m.b.leaseOf(ctx, m.key, m.slot.get)
}
