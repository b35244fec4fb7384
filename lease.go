package dsync

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsync-go/dsync/renew"
)

// A Lease is the lease of one hold, as returned by a primitive's Lease
// method. While the hold lives, the Client renews it; Done tells the holder
// when it ends.
type Lease struct {
	h        leaser
	token    uint64
	released *atomic.Bool
}

// Done returns a channel that is closed when the hold ends: released,
// lost, or no longer renewed because the Client was closed.
func (l *Lease) Done() <-chan struct{} { return l.h.Done() }

// Err returns nil while the hold lives and after it was released;
// [ErrLeaseLost] once it was lost (expired, deleted, taken over, or a fixed
// lease ran out); [ErrClosed] if the Client (or Quorum) was closed while it
// was held.
func (l *Lease) Err() error {
	select {
	case <-l.h.Done():
	default:
		return nil
	}
	if err := l.h.Err(); err != nil {
		return err
	}
	if l.released.Load() {
		return nil
	}
	return ErrClosed
}

// Token returns the hold's fencing token: every fresh acquisition of a name
// gets a token larger than all earlier ones of that name, and re-entry keeps
// it. Pass it to storage that can reject writes from a stale holder.
func (l *Lease) Token() uint64 { return l.token }

// A leaser keeps the lease of one hold: a [renew.Hold] on one deployment,
// a quorumLease over a quorum of masters (quorum_lease.go).
type leaser interface {
	Done() <-chan struct{}
	Err() error // ErrLeaseLost once lost
	Release()   // the holder released it: renewal stops, Err stays nil
	MarkLost()  // the holder learned it is gone
}

var _ leaser = (*renew.Hold)(nil)

// holdKey names the hold of one owner on one key.
type holdKey struct{ key, tok string }

// A holdID names one hold: its holder token and its fence. tokArg and
// fenceArg are the two as the unlock scripts take them, if the call that
// took the hold had them boxed already (the reply of its grant carried the
// fence); nil, they are boxed when needed.
type holdID struct {
	tok    string
	tokArg any
	// The hold's fencing token; for an RWMutex read hold, which has none,
	// the hold id its grant carried (its Lease shows 0; a quorum read
	// hold has 0, and its member holds carry their masters' ids). Either
	// tells this hold from the holder's later ones.
	fence    uint64
	fenceArg any // fence as an integer
}

// arg returns the fence of id as the scripts take it (renewals name the
// hold they extend by it).
func (id holdID) arg() any {
	if id.fenceArg != nil {
		return id.fenceArg
	}
	return id.fence
}

// hold is this process's view of one hold.
type hold struct {
	holdID
	count int // re-entries made through this process (owner mode)
	// releasing, while the owner's last release of the hold is under way
	// (client reentrancy), is closed once it is over; then the hold is
	// gone (and forgotten) unless the release failed. Guarded by base.mu.
	releasing chan struct{}
	lease     leaser
	released  atomic.Bool
	idMu      sync.Mutex
	unlockID  string // id of an unlock whose reply was lost, reused on retry
	// relMu makes the releases of this hold in this process run one at a
	// time (see lockedHold).
	relMu sync.Mutex
	// Owner holds only, guarded by base.mu: unlocks of the hold in flight,
	// and whether ownerHold recorded a later hold of the owner meanwhile
	// (see base.unlocking).
	unlocking int
	replaced  bool
}

func (h *hold) leaseView() *Lease {
	return &Lease{h: h.lease, token: h.fence, released: &h.released}
}

// lost reports whether the renewer found the hold gone.
func (h *hold) lost() bool {
	select {
	case <-h.lease.Done():
		return h.lease.Err() != nil
	default:
		return false
	}
}

func (h *hold) release() {
	h.released.Store(true)
	h.lease.Release()
}

// startHold begins renewing hold id, taken at start.
func (c *Client) startHold(cfg *config, spec renew.Spec, id holdID, start time.Time) *hold {
	spec.TTL = cfg.ttl
	spec.Interval = cfg.interval
	spec.MaxHold = cfg.maxHold
	spec.Start = start
	return &hold{holdID: id, count: 1, lease: c.renew.Add(spec)}
}

// A base is what a [Client] and a [Quorum] share, and what the Mutex and
// RWMutex handles they make rely on whichever of the two made them: the
// defaults of the handles, the bad input every call reports, the closed
// state, and the holds of owners carried in ctx.
type base struct {
	cfg    config
	err    error // bad input to the constructor, reported by every call
	closed chan struct{}
	mu     sync.Mutex
	holds  map[holdKey]*hold // holds of owners carried in ctx
	calls  map[holdKey]*callWatch
	// Tests: called when a lock call starts waiting for a release (enter).
	onWait atomic.Pointer[func()]
	// Releases whose caller's ctx ended first (see settle).
	releases tasks

	// id tells this Client's holds apart from other processes' with the
	// same owner token, under client reentrancy (see holderToken).
	id string
}

// init sets b up with opts over the default options.
func (b *base) init(opts []Option) {
	b.cfg = defaultConfig()
	b.cfg.apply(opts)
	b.err = b.cfg.err
	b.closed = make(chan struct{})
	b.holds = make(map[holdKey]*hold)
	b.calls = make(map[holdKey]*callWatch)
	b.id = newCallID()
}

// check returns the error every call through b reports, if any: b is nil
// (a handle made by a nil Client or Quorum), had bad input, or is closed.
func (b *base) check() error {
	if b == nil {
		return fmt.Errorf("%w: nil client", ErrInvalid)
	}
	if b.err != nil {
		return b.err
	}
	select {
	case <-b.closed:
		return ErrClosed
	default:
		return nil
	}
}

// handleConfig returns the configuration of a primitive called name made
// through b (which may be nil) with opts, and the bad-input error every call
// on it reports, if any.
func (b *base) handleConfig(name string, opts []Option) (config, error) {
	cfg := defaultConfig()
	if b != nil {
		cfg = b.cfg
	}
	cfg.err = nil
	cfg.apply(opts)
	err := cfg.err
	if name == "" {
		err = fmt.Errorf("%w: empty name", ErrInvalid)
	}
	return cfg, err
}

// errRegrant is what a lock call of an owner under client reentrancy
// gets when a release of the owner's hold in this process began while the
// call was under way: its grant may be a re-entry, in Redis, of the hold
// that release ends. The call is undone, and the caller takes the hold
// again once the release is over (see lockLocal).
var errRegrant = errors.New("dsync: hold released meanwhile in this process")

// A callWatch counts the lock calls of one owner on one key that went to
// Redis under client reentrancy, and the releases of the owner's hold that
// began while any of them was under way.
type callWatch struct {
	n   int    // calls under way
	rel uint64 // releases begun
}

// ownerHold records a hold (or a re-entry) of an owner carried in ctx. w
// and rel are the lock call's watch and the releases it had seen when it
// began (see enter), or nil: with a release begun since, the hold is not
// recorded and ownerHold returns errRegrant.
func (b *base) ownerHold(k holdKey, fence uint64, newHold func() *hold, w *callWatch, rel uint64) (*hold, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w != nil && w.rel != rel {
		return nil, errRegrant
	}
	if h := b.holds[k]; h != nil && h.fence == fence && !h.lost() {
		h.count++
		return h, nil
	} else if h != nil {
		// A fresh fencing token for the owner: the recorded hold has ended
		// in Redis. Unless an unlock of it is in flight, whose reply says
		// how it ended, nobody released it: it was lost (expired or
		// deleted), and its Lease says so. (Reporting it released would
		// tell a goroutine still relying on it that it ended well.)
		if h.unlocking > 0 {
			h.replaced = true
		} else {
			h.lease.MarkLost()
		}
	}
	h := newHold()
	b.holds[k] = h
	return h, nil
}

// lockLocal runs a lock call of an owner under client reentrancy, whose
// hold is recorded under k: it re-enters the owner's live hold in the
// process if there is one, and otherwise runs lock, the call to Redis.
// A hold whose last release is under way is not re-entered, since that
// release ends it in Redis: the call waits until the release is over (or
// ctx ends) and then takes the hold afresh, as it does when lock returns
// errRegrant.
func (b *base) lockLocal(ctx context.Context, k holdKey, c lockCall, lock func(c lockCall) (bool, error)) (bool, error) {
	for {
		in, w, rel, err := b.enter(ctx, k)
		if in || err != nil {
			return in, err
		}
		c.w, c.rel = w, rel
		ok, err := lock(c)
		b.mu.Lock()
		if w.n--; w.n == 0 && b.calls[k] == w {
			delete(b.calls, k)
		}
		b.mu.Unlock()
		if !errors.Is(err, errRegrant) {
			return ok, err
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
	}
}

// enter re-enters the live hold recorded under k and reports whether it
// did, after waiting for a release of it under way. Otherwise it counts a
// lock call going to Redis in the watch of k, which it returns with the
// releases it has seen.
func (b *base) enter(ctx context.Context, k holdKey) (bool, *callWatch, uint64, error) {
	for {
		b.mu.Lock()
		h := b.holds[k]
		if h != nil && h.releasing != nil {
			ch := h.releasing
			b.mu.Unlock()
			if f := b.onWait.Load(); f != nil {
				(*f)()
			}
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return false, nil, 0, ctx.Err()
			case <-b.closed:
				return false, nil, 0, ErrClosed
			}
		}
		if h != nil && !h.lost() {
			h.count++
			b.mu.Unlock()
			return true, nil, 0, nil
		}
		w := b.calls[k]
		if w == nil {
			w = &callWatch{}
			b.calls[k] = w
		}
		w.n++
		rel := w.rel
		b.mu.Unlock()
		return false, w, rel, nil
	}
}

// leaveLocal counts an unlock of the hold recorded under k (client
// reentrancy) and reports whether it was an inner one, counted here. If
// not, h is the hold the unlock must release in Redis (nil if none is
// recorded), marked releasing: the caller calls endRelease once the
// release is over. A release of the hold already under way is waited for
// first.
func (b *base) leaveLocal(k holdKey) (h *hold, inner bool) {
	for {
		b.mu.Lock()
		h = b.holds[k]
		if h != nil && h.releasing != nil {
			ch := h.releasing
			b.mu.Unlock()
			<-ch // the release has its own deadline
			continue
		}
		switch {
		case h == nil:
		case h.count > 1 && !h.lost():
			h.count--
			inner = true
		default:
			h.releasing = make(chan struct{})
			if w := b.calls[k]; w != nil {
				w.rel++
			}
		}
		b.mu.Unlock()
		return h, inner
	}
}

// endRelease ends the release of h that leaveLocal began.
func (b *base) endRelease(h *hold) {
	if h == nil {
		return
	}
	b.mu.Lock()
	if h.releasing != nil {
		close(h.releasing)
		h.releasing = nil
	}
	b.mu.Unlock()
}

// beginUnlock notes an unlock of h, an owner's recorded hold (nil: none),
// in flight; endUnlock notes its end.
func (b *base) beginUnlock(h *hold) {
	if h == nil {
		return
	}
	b.mu.Lock()
	h.unlocking++
	b.mu.Unlock()
}

// endUnlock notes the end of an unlock of h that beginUnlock noted, given
// whether its reply said it ended h. If ownerHold recorded a later hold of
// the owner meanwhile, h ended in Redis and only this reply tells whether
// it was released or lost: h ends accordingly.
func (b *base) endUnlock(h *hold, released bool) {
	if h == nil {
		return
	}
	b.mu.Lock()
	h.unlocking--
	replaced := h.replaced
	b.mu.Unlock()
	switch {
	case !replaced:
	case released:
		h.release()
	default:
		h.lease.MarkLost()
	}
}

func (b *base) lookupHold(k holdKey) *hold {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.holds[k]
}

// lockedHold returns the hold recorded under k with its release lock
// held (the caller unlocks h.relMu), or nil if none is recorded. Releases
// of one hold run one at a time in a process: two goroutines of one owner
// that release at once each release their own level, and the second finds
// a hold the first ended gone instead of reporting it lost, and never
// takes the first's retry id for its own.
func (b *base) lockedHold(k holdKey) *hold {
	for {
		h := b.lookupHold(k)
		if h == nil {
			return nil
		}
		h.relMu.Lock()
		if b.lookupHold(k) == h {
			return h
		}
		// Ended (or replaced) while this release waited its turn.
		h.relMu.Unlock()
	}
}

// dropHold forgets h if it is still the hold recorded under k.
func (b *base) dropHold(k holdKey, h *hold) {
	b.mu.Lock()
	if b.holds[k] == h {
		delete(b.holds, k)
	}
	b.mu.Unlock()
}

// handleHold is what a call finds through a handle: the hold of ctx's
// owner, recorded under key, or without an owner the handle's own hold.
func (b *base) handleHold(ctx context.Context, key string, sl *slot) (*hold, error) {
	tok, owned, err := owner(ctx)
	if err != nil {
		return nil, err
	}
	var h *hold
	if owned {
		h = b.lookupHold(holdKey{key, tok})
	} else {
		h = sl.get()
	}
	if h == nil {
		return nil, ErrNotHeld
	}
	return h, nil
}

// holderToken is the token under which owner tok holds in Redis: tok
// itself with script reentrancy, so that a token carried to another
// process re-enters there; with client reentrancy, tok qualified by this
// Client, so that a carried token waits there like any other owner (the
// count lives in one process).
func (b *base) holderToken(cfg *config, tok string) string {
	if cfg.local {
		return tok + "@" + b.id
	}
	return tok
}

// A slot is where a handle keeps the hold it took without an owner in ctx.
// Like a sync.Mutex value, the handle is locked from the Lock that filled
// the slot until the Unlock that empties it, also when the hold was lost
// meanwhile: a gate, taken by Lock and given back by Unlock (or by a Lock
// that failed), makes a second Lock through the handle wait.
type slot struct {
	gate chan struct{} // holds a value while the handle is locked
	mu   sync.Mutex
	cur  *hold
}

func newSlot() slot { return slot{gate: make(chan struct{}, 1)} }

// enter locks the handle's gate, waiting with wait, and reports whether it
// did.
func (s *slot) enter(ctx context.Context, wait bool, closed <-chan struct{}) (bool, error) {
	select {
	case s.gate <- struct{}{}:
		return true, nil
	default:
	}
	if !wait {
		return false, nil
	}
	select {
	case s.gate <- struct{}{}:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	case <-closed:
		return false, ErrClosed
	}
}

// leave unlocks the handle's gate.
func (s *slot) leave() { <-s.gate }

func (s *slot) set(h *hold) {
	s.mu.Lock()
	s.cur = h
	s.mu.Unlock()
}

// clear empties the slot if it holds h, and reports whether it did.
func (s *slot) clear(h *hold) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != h {
		return false
	}
	s.cur = nil
	return true
}

func (s *slot) get() *hold {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}
