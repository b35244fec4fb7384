package dsync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Owners' holds as this process records them: re-entries, the lock
// calls and releases of one owner under client reentrancy, unlocks in
// flight, and the lookups of the release path (release.go).

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

// errOtherMode is the error of a call of an owner, through a handle of one
// reentrancy mode, on a name whose hold the owner has in this Client
// through a handle of the other mode: the two modes hold under different
// tokens in Redis (see holderToken) and count levels in different places,
// so the call is refused and changes nothing.
var errOtherMode = fmt.Errorf("%w: ctx's owner holds this name in this Client through a handle of the other reentrancy mode (ClientReentrancy)", ErrInvalid)

// otherMode returns errOtherMode if the owner otok has a live hold
// recorded under one of keys under another holder token than tok (the
// one a call through this handle holds under), and nil otherwise.
func (b *base) otherMode(otok, tok string, keys ...string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, k := range keys {
		if h := b.holds[holdKey{k, otok}]; h != nil && h.tok != tok && !h.lost() {
			return errOtherMode
		}
	}
	return nil
}

// errSuperseded is what a lock call of an owner gets whose grant, on one
// deployment (lockCall.ordered), has a fencing token below that of the
// owner's live recorded hold. A holder's tokens rise, and a holder is
// given a fresh hold only where it holds none: the grant's hold ended
// before the recorded one began (a hand-over or reply learned late, after
// the name's keys were deleted or an Unlock of the owner from another
// goroutine ended it, and another goroutine took the name again). The
// call, whose level is gone, is over, as after a grant of kind over: it
// records nothing and the caller starts it again as a new call (see
// Client.restartCall), which re-enters the recorded hold. (Recorded as
// the owner's hold, it would mark the live one lost, which Redis keeps
// and nobody renews, and end in ErrLeaseLost.) So does a call whose grant
// is of a hold that an Unlock of the owner ended, told by that Unlock's
// reply, which came first (see ownerFlight), whether or not the owner
// holds afresh: the call takes the name again, rather than return with a
// hold that Redis no longer has (reported lost, its Unlock ErrLeaseLost),
// as it would do had it asked Redis after the Unlock (a grant of kind
// over). In quorum mode, so does a call whose grants, without those of
// member holds so ended, are fewer than a majority (see quorumLock.lock).
var errSuperseded = errors.New("dsync: grant older than the owner's hold in this process")

// ownerHold records a hold (or a re-entry) of an owner carried in ctx,
// taken by lock call c. c.w and c.rel are the call's watch and the
// releases it had seen when it began (see enter), or nil: with a release
// begun since, the hold is not recorded and ownerHold returns errRegrant.
// A grant older than the owner's live recorded hold, to a call whose
// tokens are ordered, records nothing either: errSuperseded.
func (b *base) ownerHold(k holdKey, fence uint64, newHold func() *hold, c lockCall) (*hold, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h := b.holds[k]; c.ordered && h != nil && fence < h.fence && !h.lost() {
		return nil, errSuperseded
	}
	if b.grantEndedLocked(holdKey{k.key, c.tok}, fence, c.ordered) {
		return nil, errSuperseded
	}
	return b.ownerHoldLocked(k, fence, newHold, c.w, c.rel)
}

// grantEnded reports whether a grant with fencing token (or, unordered,
// read hold id) fence to a call of owner k in flight is of a hold that a
// release has ended, told by its reply (see ownerFlight). A quorum lock
// call asks each member Client so of its master's grant (see
// quorumLock.lock). grantEndedLocked is grantEnded with b.mu held.
func (b *base) grantEnded(k holdKey, fence uint64, ordered bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.grantEndedLocked(k, fence, ordered)
}

func (b *base) grantEndedLocked(k holdKey, fence uint64, ordered bool) bool {
	f, ok := b.ownerFlights[k]
	return ok && f.ended(fence, ordered)
}

// ownerHolding is ownerHold for a grant of permits to a Semaphore owner,
// whose permits add up whichever of its calls took them: a grant with a
// fencing token below that of the owner's recorded holding is of a
// holding that ended before that one began (an owner's tokens rise; a
// hand-over learned late, after a Release of the owner ended the holding
// and another Acquire took a new one), so nothing of it is held, and it
// records nothing (nil).
func (b *base) ownerHolding(k holdKey, fence uint64, newHold func() *hold) *hold {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h := b.holds[k]; h != nil && fence < h.fence {
		return nil
	}
	if f, ok := b.ownerFlights[k]; ok && fence <= f.gone {
		// The reply of a release that ended this holding came first.
		return nil
	}
	h, _ := b.ownerHoldLocked(k, fence, newHold, nil, 0)
	return h
}

// An ownerFlight counts the calls of an owner that take a hold on one
// deployment in flight in this process (Semaphore Acquires, Mutex Locks,
// RWMutex Locks and RLocks; in quorum mode, each member Client counts the
// quorum calls, whose grant on its master is one deployment's: see
// quorumLock.lock), by the key its holds are recorded under (a
// primitive's first key; an RWMutex's readers key for RLocks) and the
// holder token the scripts see, and keeps the fencing token of the owner's last hold
// (holding) that a release ended meanwhile, told by the release's reply:
// a call granted that hold (permits in that holding), whose reply came
// after the release's, holds nothing of it (a Semaphore handle keeps the
// same in Semaphore.gone). A Mutex or write Unlock tells only when it
// names no hold: the owner had none on record, and the hold it ended may
// be one that a Lock in flight was granted. A grant with a token no
// larger than one ended is of a hold that has ended (a holder's tokens
// rise). Kept by value: an owner's Lock allocates nothing for it.
//
// Read holds carry ids, not ordered tokens: an RUnlock that names no hold
// tells the id of the read hold it ended, and the flight keeps the last
// few such ids (goneReads, nil until an RUnlock tells one while RLock
// calls of the owner are in flight), a grant of one of which holds nothing.
type ownerFlight struct {
	n         int
	gone      uint64
	goneReads []uint64
}

// maxGoneReads bounds ownerFlight.goneReads: an owner whose RUnlocks end
// more read holds than this while its RLock calls are in flight is told
// of the earlier ones by their leases' renewals (as before the ids were
// kept), not at once.
const maxGoneReads = 8

// ended reports whether a grant with fencing token (or, unordered, read
// hold id) fence is of a hold that a release told f of has ended.
func (f ownerFlight) ended(fence uint64, ordered bool) bool {
	if ordered {
		return fence <= f.gone
	}
	return slices.Contains(f.goneReads, fence)
}

// ownerFlightBegin counts a call of owner k in flight; ownerFlightEnd
// ends it.
func (b *base) ownerFlightBegin(k holdKey) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.ownerFlights[k]
	f.n++
	b.ownerFlights[k] = f
}

func (b *base) ownerFlightEnd(k holdKey) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.ownerFlights[k]
	if f.n--; f.n == 0 {
		delete(b.ownerFlights, k)
		return
	}
	b.ownerFlights[k] = f
}

// ownerEnded notes that a release ended owner k's hold (holding) with
// fencing token fence, for the calls of k in flight (see ownerFlight).
func (b *base) ownerEnded(k holdKey, fence uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if f, ok := b.ownerFlights[k]; ok {
		f.gone = max(f.gone, fence)
		b.ownerFlights[k] = f
	}
}

// readEnded notes that an RUnlock ended owner k's read hold with id rid,
// for the RLock calls of k in flight (see ownerFlight).
func (b *base) readEnded(k holdKey, rid uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if f, ok := b.ownerFlights[k]; ok {
		if len(f.goneReads) == maxGoneReads {
			f.goneReads = slices.Delete(f.goneReads, 0, 1)
		}
		f.goneReads = append(f.goneReads, rid)
		b.ownerFlights[k] = f
	}
}

// unnamedEnded notes that an Unlock of the owner whose holder token is
// tok, naming no hold (the owner had none on record when it was sent),
// ended the hold with fencing token fence of the lock whose first key is
// key: the calls of the owner in flight are told (see ownerEnded), and a
// hold with that token that a Lock of the owner recorded meanwhile (its
// reply came before the Unlock's) is over in Redis: its lease is lost,
// rather than reported live while another owner may hold the name (its
// Unlock then names it and returns ErrLeaseLost).
func (b *base) unnamedEnded(cfg *config, key, tok string, fence uint64, ordered bool) {
	if ordered {
		b.ownerEnded(holdKey{key, tok}, fence)
	} else {
		b.readEnded(holdKey{key, tok}, fence)
	}
	if h := b.lookupHold(holdKey{key, b.ownerOf(cfg, tok)}); h != nil && h.fence == fence && !h.lost() {
		h.lease.MarkLost()
	}
}

// ownerOf returns the owner token of holder token tok of a handle with
// configuration cfg: under client reentrancy, tok without b's id (see
// holderToken).
func (b *base) ownerOf(cfg *config, tok string) string {
	if cfg.local {
		if n := len(tok) - len(b.id) - 1; n > 0 && tok[n] == '@' && tok[n+1:] == b.id {
			return tok[:n]
		}
	}
	return tok
}

// ownerHoldLocked is ownerHold with b.mu held.
func (b *base) ownerHoldLocked(k holdKey, fence uint64, newHold func() *hold, w *callWatch, rel uint64) (*hold, error) {
	if w != nil && w.rel != rel {
		return nil, errRegrant
	}
	h := b.holds[k]
	if h != nil && h.fence == fence && !h.lost() {
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
	nh := newHold()
	if h != nil && h.holding && h.fence == fence {
		// A Semaphore holding reported lost that Redis kept, which this
		// grant joined: its permits are held under a new lease, and are
		// the new record's, which Releases in flight for the lost one
		// count for (see Semaphore.recordOf), and so does a Release of all
		// its permits with an unknown outcome recorded on it.
		nh.permits.Store(h.permits.Load())
		nh.owes = h.owes
		if id, un, lost := h.takeUnsure(); id != "" {
			nh.setUnsure(id, un, lost)
		}
	} else if h != nil {
		// The owner's releases of the levels of the hold it replaces end
		// levels of this one, and once it ends, name it.
		nh.owes = h.owes + h.levels()
		// An unlock of the replaced hold that got no reply may have ended
		// it (this hold is fresh): its repeat, the owner's next unlock,
		// settles it under its own id (see unlockOwner).
		if h.repeat != nil {
			nh.repeat = h.repeat
		} else if !h.holding && h.unlocking == 0 && h.unlockPending() {
			nh.repeat = h
		}
	}
	if e := b.owed[k]; e != nil {
		nh.owes += e.n
		delete(b.owed, k)
	}
	b.holds[k] = nh
	return nh, nil
}

// lockThrough runs a lock call made through a handle with configuration
// cfg: for ctx's owner, whose holds are recorded under key, or without an
// owner for the handle, whose slot sl (nil: none) it enters first and
// leaves again unless the call took the hold. The handle is locked from
// Lock to Unlock, as a sync.Mutex is, also when its hold was lost
// meanwhile. lock makes the call's attempts for holder c.tok (see
// mutexImpl.lock); an owner's re-entry under client reentrancy makes none
// (see lockLocal).
func (b *base) lockThrough(ctx context.Context, cfg *config, key string, sl *slot, wait bool, lock func(c lockCall) (bool, error)) (bool, error) {
	otok, owned, err := callOwner(ctx)
	if err != nil {
		return false, err
	}
	c := lockCall{otok: otok, owned: owned}
	if owned {
		c.tok = b.holderToken(cfg, otok)
		if err := b.otherMode(otok, c.tok, key); err != nil {
			return false, err
		}
		if cfg.local {
			return b.lockLocal(ctx, holdKey{key, otok}, c, lock)
		}
	} else {
		if sl != nil {
			if ok, err := sl.enter(ctx, wait, b.closed); !ok || err != nil {
				return false, err
			}
		}
		c.tok = newToken()
	}
	ok, err := lock(c)
	if !ok && !owned && sl != nil {
		sl.leave()
	}
	return ok, err
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
// first with wait; without, leaveLocal counts nothing and reports busy,
// and the caller calls it again with wait where its ctx does not bound
// the wait (see settle): that release lasts as long as the server takes
// to answer, and an Unlock returns when its ctx ends.
func (b *base) leaveLocal(k holdKey, wait bool) (h *hold, inner, busy bool) {
	for {
		b.mu.Lock()
		h = b.holds[k]
		if h != nil && h.releasing != nil {
			ch := h.releasing
			b.mu.Unlock()
			if !wait {
				return nil, false, true
			}
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
		return h, inner, false
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

// dropHold forgets h if it is still the hold recorded under k, ended by
// a release of n of its levels (permits; 0 if that release counted its
// level already), or lost. Its other levels the owner's goroutines still
// have to release, which name h when they come (see owe).
func (b *base) dropHold(k holdKey, h *hold, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.holds[k] != h {
		return
	}
	delete(b.holds, k)
	if left := h.owes + max(h.levels()-n, 0); left > 0 {
		b.owe(k, h, left)
	}
}

// levels is what the owner's releases of h in this process may still
// end: the permits of a Semaphore holding, the levels of a lock's hold.
// b.mu must be held.
func (h *hold) levels() int64 {
	if h.holding {
		return h.permits.Load()
	}
	return int64(h.count)
}

// owedMemory is how long a Client names an ended hold of an owner in the
// releases the owner still owes for it (see owe).
const owedMemory = 10 * time.Minute

// An owedLevels is an ended hold of an owner (its id, and a quorum hold's
// lease, whose member holds the releases name) with the levels (permits)
// of it that the owner's goroutines have still to release in this process.
type owedLevels struct {
	id    holdID
	lease leaser
	n     int64
	at    time.Time
}

// owe notes n levels (permits) of h, the owner's hold recorded under k,
// that its goroutines have still to release though h ended on record
// here: lost (the levels of a lost hold go with it), released by other
// goroutines of the owner, or replaced by a later hold that ended too.
// Those releases find no hold on record; sent naming no hold, one delayed
// in the network would end a level of a hold the owner takes after it
// was sent, and the owner would hold what Redis has freed. They name h
// instead (see owedHold), which ends nothing later. The note is kept
// until they came, the owner holds again here (its releases then end
// levels of the new hold), or owedMemory passed. b.mu must be held.
func (b *base) owe(k holdKey, h *hold, n int64) {
	now := time.Now()
	if now.Sub(b.owedSwept) > owedMemory/2 {
		for k, e := range b.owed {
			if now.Sub(e.at) > owedMemory {
				delete(b.owed, k)
			}
		}
		b.owedSwept = now
	}
	var l leaser
	if _, ok := h.lease.(*quorumLease); ok {
		l = h.lease
	}
	b.owed[k] = &owedLevels{id: h.holdID, lease: l, n: n, at: now}
}

// owedHold returns the hold a release of n levels (permits) by the owner
// whose holds are recorded under k names when none is recorded: the
// ended hold whose levels it still owes (see owe), as a hold that only
// names it; nil if it owes none.
func (b *base) owedHold(k holdKey, n int64) *hold {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.owed[k]
	if e == nil {
		return nil
	}
	if time.Since(e.at) > owedMemory {
		delete(b.owed, k)
		return nil
	}
	if e.n -= n; e.n <= 0 {
		delete(b.owed, k)
	}
	return &hold{holdID: e.id, lease: e.lease}
}

// reowe gives back n levels (permits) that owedHold gave a release which
// named hold named, when the release's outcome is unknown (no reply
// came): its caller may repeat it, and the repeat must name a hold too.
// If the owner holds again meanwhile, they go to that hold, as the levels
// of a hold it replaces do.
func (b *base) reowe(k holdKey, named *hold, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch h, e := b.holds[k], b.owed[k]; {
	case h != nil:
		h.owes += n
	case e != nil:
		e.n += n
	default:
		b.owed[k] = &owedLevels{id: named.holdID, lease: named.lease, n: n, at: time.Now()}
	}
}
