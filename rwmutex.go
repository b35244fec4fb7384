package dsync

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/dsync-go/dsync/internal/keys"
)

// Lock modes, as the scripts spell them.
const (
	modeRead  = "r"
	modeWrite = "w"
)

// An RWMutex is a reader/writer mutual exclusion lock shared by every
// process that names it, the distributed twin of [sync.RWMutex]: any number
// of readers or one writer hold it. Get one with [Client.RWMutex] (or, over
// several independent masters, [Quorum.RWMutex]); an RWMutex handle is safe
// for concurrent use and cheap, so make one where needed.
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
// [Quorum] every hold, read or write, is granted by a majority of
// independent masters.
//
// Writers are preferred, as in sync.RWMutex: once a writer waits, new
// readers wait too (an owner re-entering its read hold does not), so a
// stream of readers cannot starve a writer; and a writer's Unlock makes
// every reader that waited for it a holder at once, so a stream of writers
// cannot starve readers. No writer starves other writers either: as in
// sync.Mutex's starvation mode (here from its first refused attempt on), a
// writer takes a place in a queue kept in Redis, newcomer writers
// (including one that just unlocked) queue behind it, and the release that
// frees the lock (the last RUnlock, or an Unlock with no reader waiting)
// hands it straight to the first in line. Waiters are woken by
// notifications, not by polling. On a [Quorum] writers do not queue. Write
// Lock calls without an owner that wait while another writer of the same
// Client holds the name (or tries for it) wait in the process, in arrival
// order, and that writer's Unlock passes the write lock to the first of
// them in its own round trip (with a new fencing token), unless readers
// wait; while writers of other processes are queued, at most 8 times in a
// row before the first of those gets it.
type RWMutex struct {
	handle        // the Client's or Quorum's base, configuration, bad input
	impl   rwImpl // takes and releases the holds
	// the writer hash and the readers zset: owners' holds are recorded
	// under them
	wkey, rkey string

	slot  slot // the handle's write hold, without an owner in ctx
	mu    sync.Mutex
	reads []*hold // the handle's read holds, without an owner, latest last
	// How many of reads an RUnlock gave back with its outcome unknown (see
	// takeRead).
	unsettled int
}

// An rwImpl takes and releases the holds of an RWMutex: on one deployment
// (rwScripts, rwmutex_scripts.go) or on a quorum of masters (quorumRWMutex in
// quorum_rwmutex.go). The RWMutex methods do the rest, the same in both
// modes.
type rwImpl interface {
	// lock makes the attempts of one lock call in mode for holder c.tok
	// and, if it takes the hold, records it with rw.held. It reports
	// whether it did; on an error it leaves no hold behind.
	lock(ctx context.Context, rw *RWMutex, mode string, c lockCall, wait bool) (bool, error)
	// unlock runs the unlock script in mode for holder tok with call id,
	// ending h (nil if not recorded here): 1 released, 2 still held with a
	// lower count, 0 not held.
	unlock(ctx context.Context, mode, tok, id string, h *hold) (int64, error)
}

// RWMutex returns a handle on the RWMutex called name. Options override the
// Client's defaults for this handle. An empty name or a bad option makes
// every call on the handle fail with [ErrInvalid]. An RWMutex and a [Mutex]
// of the same name are distinct locks.
func (c *Client) RWMutex(name string, opts ...Option) *RWMutex {
	rw, k := newRWMutex(c.shared(), name, opts)
	s := newRWScripts(c, &rw.cfg, k, name)
	if rw.cfg.replicas == 0 && c != nil {
		s.co = &c.cohorts
	}
	rw.impl = s
	return rw
}

// newRWMutex returns a handle, without its impl, on the RWMutex called
// name made through b, and the RWMutex's keys.
func newRWMutex(b *base, name string, opts []Option) (*RWMutex, keys.RWMutex) {
	rw := &RWMutex{handle: b.newHandle(name, opts), slot: newSlot()}
	k := keys.ForRWMutex(rw.cfg.prefix, name)
	rw.wkey, rw.rkey = k.Writer, k.Readers
	return rw, k
}

func (rw *RWMutex) check() error {
	if rw == nil {
		return fmt.Errorf("%w: nil RWMutex", ErrInvalid)
	}
	return rw.handle.check()
}

// RLock locks rw for reading, waiting while a writer holds it or waits for
// it, until ctx is done. On success the read hold lasts until RUnlock,
// renewed by the Client; with an owner in ctx that already reads (or writes)
// rw, RLock takes (another level of) a read hold at once. On failure it
// returns an error for which errors.Is(err, ctx.Err()) holds (or a Redis or
// [ErrClosed] error) and leaves no hold behind, also when the server granted
// the hold but the reply was lost (unless Redis stays unreachable for more
// than 5 s: see the package documentation).
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
// [ErrUpgrade] at once; so does a waiting Lock once its owner reads (an
// RLock of the owner does not wait behind the owner's own waiting Lock),
// and the readers it held back go on at once. On failure it returns an
// error for which
// errors.Is(err, ctx.Err()) holds (or a Redis or [ErrClosed] error) and
// leaves no hold behind, also when the server took the lock but the reply
// was lost (unless Redis stays unreachable for more than 5 s: see the
// package documentation); readers that waited behind it go on at once.
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
	// The handle is write-locked from Lock to Unlock, as a sync.RWMutex
	// is; its read holds take no slot.
	var sl *slot
	if mode == modeWrite {
		sl = &rw.slot
	}
	if otok, owned, err := callOwner(ctx); err == nil && owned {
		if err := rw.otherMode(otok, mode); err != nil {
			return false, err
		}
	}
	return rw.b.lockThrough(ctx, &rw.cfg, rw.modeKey(mode), sl, wait, func(c lockCall) (bool, error) {
		return rw.impl.lock(ctx, rw, mode, c, wait)
	})
}

// otherMode refuses a lock call in mode of owner otok through rw if the
// owner holds rw in this Client through a handle of the other reentrancy
// mode (see base.otherMode): with ErrUpgrade for the write lock while it
// reads there, and does not write, else with errOtherMode (a downgrade or
// a re-entry across modes is not made).
func (rw *RWMutex) otherMode(otok, mode string) error {
	tok := rw.b.holderToken(&rw.cfg, otok)
	if rw.b.otherMode(otok, tok, rw.rkey, rw.wkey) == nil {
		return nil
	}
	if mode == modeWrite && rw.b.otherMode(otok, tok, rw.rkey) != nil && rw.b.lookupHold(holdKey{rw.wkey, otok}) == nil {
		return ErrUpgrade
	}
	return errOtherMode
}

// modeKey returns the key under which owners' holds in mode are recorded.
func (rw *RWMutex) modeKey(mode string) string {
	if mode == modeRead {
		return rw.rkey
	}
	return rw.wkey
}

func (rw *RWMutex) holdKey(mode, tok string) holdKey { return holdKey{rw.modeKey(mode), tok} }

// held records a hold in mode taken (or re-entered) by call c with fencing
// token fence; newHold starts the lease of a hold that is not a re-entry.
// An error (errRegrant) means it recorded nothing: the caller undoes the
// call.
func (rw *RWMutex) held(mode string, c lockCall, fence uint64, newHold func() *hold) (*hold, error) {
	if c.owned {
		return rw.b.ownerHold(rw.holdKey(mode, c.otok), fence, newHold, c)
	}
	h := newHold()
	if mode == modeWrite {
		rw.slot.set(h)
		return h, nil
	}
	rw.mu.Lock()
	rw.reads = append(rw.reads, h)
	rw.mu.Unlock()
	return h, nil
}

// takeRead removes the read hold the handle's next RUnlock releases, so
// that no other unlock releases it too: one whose RUnlock had an unknown
// outcome, if any, else the latest. An RUnlock that got no reply may have
// ended its hold in Redis; its repeat must settle that hold under the same
// call id, not end a read hold taken through the handle meanwhile (which
// would leave the handle a hold that Redis no longer has, reported live
// until a renewal finds it gone, while a writer takes the name).
func (rw *RWMutex) takeRead() *hold {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	n := len(rw.reads)
	if n == 0 {
		return nil
	}
	i := n - 1
	if rw.unsettled > 0 {
		rw.unsettled--
		for j := n - 1; j >= 0; j-- {
			if rw.reads[j].unlockPending() {
				i = j
				break
			}
		}
	}
	h := rw.reads[i]
	rw.reads = slices.Delete(rw.reads, i, i+1)
	return h
}

// restoreRead gives back a read hold taken by takeRead that its unlock did
// not end; unsettled: the unlock failed (its outcome may be unknown), and a
// repeat of it takes h again, under the same call id (see takeRead).
func (rw *RWMutex) restoreRead(h *hold, unsettled bool) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	rw.reads = append(rw.reads, h)
	if unsettled {
		rw.unsettled++
	}
}

// RUnlock releases one read hold: one level of an owner's re-entry, or the
// handle's most recent read hold. It does not affect other readers. Like
// Unlock it runs even if ctx is already done, and completes in the
// background if ctx ends while it is under way. It returns
// [ErrNotHeld] if the caller holds no read lock on rw and [ErrLeaseLost] if
// the hold was lost before RUnlock; in both cases nothing is changed. After
// a Redis error, its ctx still open, the outcome is unknown and the hold
// still counts: repeat the RUnlock. The repeat is sent under the first
// one's call id, for the read hold it was sent for (not the handle's most
// recent one), and answers as it would have, also when another goroutine
// took a read hold in between, if it comes within the replay window (as
// for [Mutex.Unlock]).
func (rw *RWMutex) RUnlock(ctx context.Context) error {
	return rw.unlock(ctx, modeRead)
}

// Unlock releases the write lock: one level of an owner's re-entry, or the
// handle's write hold. A read hold the owner took while writing (a
// downgrade) stays. On the last level every reader that waited for the
// writer becomes a holder. It runs even if ctx is already done; if ctx ends
// before its outcome is known (or, already done, the outcome does not come
// within a few ms), Unlock returns ctx's error then and the release
// completes in the background, as if the caller had waited (it is not to
// be repeated). It returns [ErrNotHeld] if the caller does not hold the
// write lock and [ErrLeaseLost] if the hold was lost before Unlock; in both
// cases nothing is changed. After a Redis error, its ctx still open, the
// outcome is unknown: repeat the Unlock, as for [Mutex.Unlock].
func (rw *RWMutex) Unlock(ctx context.Context) error {
	return rw.unlock(ctx, modeWrite)
}

func (rw *RWMutex) unlock(ctx context.Context, mode string) error {
	if err := rw.check(); err != nil {
		return err
	}
	otok, owned, err := owner(ctx)
	if err != nil {
		return err
	}
	var h *hold
	busy := false
	if owned {
		if err := rw.b.otherMode(otok, rw.b.holderToken(&rw.cfg, otok), rw.modeKey(mode)); err != nil {
			return err
		}
	}
	if owned && rw.cfg.local {
		var inner bool
		if h, inner, busy = rw.b.leaveLocal(rw.holdKey(mode, otok), false); inner {
			// Client reentrancy: an inner unlock, counted in this process.
			return nil
		}
	}
	return settle(rw.b, ctx, rwRelease{rw, mode, otok, owned, h, busy}, rwSettler)
}

// rwRelease is what an unlock of rw releases: a level of owner otok's hold
// in mode (owned; h under client reentrancy: the hold of its last level),
// or a hold of the handle.
type rwRelease struct {
	rw    *RWMutex
	mode  string
	otok  string
	owned bool
	h     *hold
	busy  bool // see mutexRelease
}

var rwSettler = &settler[rwRelease]{f: releaseRW}

// releaseRW is unlock once an inner unlock under client reentrancy is
// ruled out, on a ctx from settle.
func releaseRW(ctx context.Context, a rwRelease) error {
	rw, mode := a.rw, a.mode
	run := func(ctx context.Context, tok, id string, h *hold) (int64, error) {
		return rw.impl.unlock(ctx, mode, tok, id, h)
	}
	if !a.owned {
		return rw.unlockHandle(ctx, mode, run)
	}
	if rw.cfg.local {
		if a.busy {
			var inner bool
			if a.h, inner, _ = rw.b.leaveLocal(rw.holdKey(mode, a.otok), true); inner {
				return nil
			}
		}
		// Lock calls of the owner wait until the release is over.
		defer rw.b.endRelease(a.h)
	}
	return rw.b.unlockOwner(ctx, rw.holdKey(mode, a.otok), rw.b.holderToken(&rw.cfg, a.otok), run, rw.cfg.local, a.h)
}

// unlockHandle releases the handle's write hold, or its most recent read
// hold, on a ctx from settle. A handle's holds have a count of one and no
// owner records them.
func (rw *RWMutex) unlockHandle(ctx context.Context, mode string, run releaser) error {
	if mode == modeWrite {
		return rw.b.unlockSlot(ctx, &rw.slot, run)
	}
	h := rw.takeRead()
	if h == nil {
		return ErrNotHeld
	}
	// As in base.unlockSlot: a lease reported lost before the release
	// stays lost.
	id, lostBefore := h.unlockCall()
	h.beginRelease()
	defer h.endRelease()
	r, err := run(ctx, h.tok, id, h)
	if err != nil && unknownOutcome(err) && callerLeft(ctx) {
		// Its caller left: the release settles its outcome alone (see
		// base.unlockSlot).
		r, err = rw.b.retryRelease(ctx, func(ctx context.Context) (int64, error) { return run(ctx, h.tok, id, h) }, r, err)
		if err != nil && unknownOutcome(err) {
			h.unlocked()
			h.lease.MarkLost()
			return err
		}
	}
	if err != nil {
		// The outcome is unknown: keep the hold, and let a retry reuse id.
		rw.restoreRead(h, true)
		return err
	}
	h.unlocked()
	switch {
	case r == 1 && !lostBefore:
		h.release()
		return nil
	case r == 0 || r == 1:
		h.lease.MarkLost()
		return ErrLeaseLost
	case r == 2:
		// Still held.
		rw.restoreRead(h, false)
		return nil
	}
	rw.restoreRead(h, false)
	return replyError("unlock", r)
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
	if mode == modeWrite {
		return rw.b.leaseOf(ctx, rw.wkey, rw.slot.get)
	}
	l, err := rw.b.leaseOf(ctx, rw.rkey, rw.lastRead)
	if l != nil {
		// A read hold's h.fence is its hold id, not a fencing token.
		l.token = 0
	}
	return l, err
}

// lastRead returns the handle's most recent read hold (nil if none).
func (rw *RWMutex) lastRead() *hold {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if n := len(rw.reads); n > 0 {
		return rw.reads[n-1]
	}
	return nil
}
