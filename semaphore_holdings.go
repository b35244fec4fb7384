package dsync

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/dsync-go/dsync/renew"
)

// What a Semaphore handle knows of its holdings in this process: the
// handle's token, permits taken, added and released, holdings ended by a
// release or lost, and the permits of lost holdings that Releases still
// owe (see Semaphore.Release).

// A pendingHolding is a holding of a handle, with the permits it had, that
// a Release in flight may have ended.
type pendingHolding struct {
	h *hold
	n int64
}

// handleToken returns the handle's holder token, and boxed once.
func (s *Semaphore) handleToken() (string, any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tok == "" {
		s.tok = newToken()
		s.tokArg = s.tok
	}
	return s.tok, s.tokArg
}

// held records n permits taken in holding id.
func (s *Semaphore) held(id holdID, owned bool, n int64, start time.Time, fl *handleFlight) {
	tok, fence := id.tok, id.fence
	newHold := func() *hold {
		return s.c.startHold(&s.cfg, renew.Spec{
			Batch: semRenew,
			Keys:  s.rkeys,
			Args:  []any{id.tokArg, s.ttlArg, id.arg()},
		}, id, start)
	}
	if owned {
		newHolding := func() *hold {
			h := newHold()
			h.holding = true
			return h
		}
		if h := s.c.ownerHolding(holdKey{s.keys[0], tok}, fence, newHolding); h != nil {
			s.c.mu.Lock()
			h.permits.Add(n)
			joinedLocked(h, &h.permits)
			s.c.mu.Unlock()
		}
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if fence <= s.gone || (s.cur != nil && fence < s.cur.fence) {
		// A grant of a holding that ended before the handle's current
		// one began (a holder's tokens rise), or no later than the last
		// one a release ended: nothing of it is held. If the reply of a
		// release that ended it came first, the permits went with it;
		// else it was lost (or a release in flight ends it), and they
		// stay the handle's to release, as those of a holding it
		// replaced do (see lostLocked): Releases settle them, and must
		// not end a later holding's permits for them.
		if !fl.unsure && !slices.Contains(fl.ended, fence) {
			s.lateLocked(fence, n)
		}
		return
	}
	if s.cur != nil && s.cur.fence == fence {
		if s.cur.lost() {
			// Reported lost, but Redis kept the holding, which this grant
			// joined and extended: its permits are held under a new lease,
			// renewed again, as an owner's are (see base.ownerHoldLocked).
			// The lost lease stays lost. Releases in flight that name the
			// holding by the lost one count for the new one: the
			// handle's bookkeeping matches holdings by fencing token
			// (see sameHolding), and so does a Release of all its permits
			// with an unknown outcome recorded on it (see setUnsure).
			old := s.cur
			s.cur, s.curN = newHold(), s.curN+n
			s.curN = joined(old, s.curN)
			return
		}
		s.curN = joined(s.cur, s.curN+n) // added to the holding
		return
	}
	if s.cur != nil {
		// The handle's holding ended, or the permits would have been
		// added to it: a Release in flight ended it, or it was lost.
		if s.releasing > 0 {
			s.pending = append(s.pending, pendingHolding{s.cur, s.curN})
		} else {
			s.lostLocked(s.cur, s.curN)
		}
	}
	s.cur, s.curN = newHold(), n
}

// joined returns the permits of h, a holding that an Acquire of its
// holder joined (the same fencing token), n with the Acquire's, less
// those of a Release of all its permits whose outcome is unknown recorded
// on it (see setUnsure): the join shows that the Release had not ended
// the holding when the Acquire's script ran, so it was, or its copy still
// on its way will be, a Release of only some of the holding's permits,
// which counts as done (see Semaphore.Release). The record is dropped: a
// Release that later finds the holding gone is no repeat of it, and
// reports the holding lost (a repeat of that Release would tell only that
// it ran, not that it ended the holding). s.mu (the handle's) or the
// Client's mu (an owner's) must be held.
func joined(h *hold, n int64) int64 {
	if _, un, _ := h.takeUnsure(); un > 0 {
		return max(n-un, 0)
	}
	return n
}

// joinedLocked is joined for an owner's holding h, whose permits p
// counts (h.permits), with the Client's mu held.
func joinedLocked(h *hold, p *atomic.Int64) {
	if _, un, _ := h.takeUnsure(); un > 0 {
		for {
			v := p.Load()
			if p.CompareAndSwap(v, max(v-un, 0)) {
				return
			}
		}
	}
}

// unsure notes a Release of n permits of h, holder tok's holding, sent
// with call id, whose outcome is unknown, and that was of every permit of
// the holding this process knew of when it was sent; lost says whether
// h's lease was reported lost by then. If an Acquire of the holder joined
// the holding since, it was a Release of only some of its permits, which
// counts as done (see joined); else it is recorded on the holding's
// record (see setUnsure).
func (s *Semaphore) unsure(owned bool, tok string, h *hold, id string, n int64, lost bool) {
	if owned {
		s.c.mu.Lock()
		defer s.c.mu.Unlock()
		r := s.ownerRecordLocked(tok, h)
		r.setUnsure(id, n, lost)
		if r.permits.Load() != n {
			joinedLocked(r, &r.permits)
		}
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sameHolding(s.cur, h) {
		s.cur.setUnsure(id, n, lost)
		if s.curN != n {
			s.curN = joined(s.cur, s.curN)
		}
		return
	}
	for i := range s.pending {
		if sameHolding(s.pending[i].h, h) {
			s.pending[i].h.setUnsure(id, n, lost)
			return
		}
	}
	h.setUnsure(id, n, lost)
}

// A lateGrant is a grant of n permits into the handle's holding with
// fencing token fence, learned after a later holding replaced it while
// Releases were in flight, one of which may have ended it.
type lateGrant struct {
	fence uint64
	n     int64
}

// lateLocked records n permits granted into the handle's holding with
// fencing token fence, which ended before the grant was learned, and not
// by a release whose reply came first: released with it if it is a
// pending holding or a Release in flight ends it, else lost, and owed.
// s.mu must be held.
func (s *Semaphore) lateLocked(fence uint64, n int64) {
	for i := range s.pending {
		if s.pending[i].h.fence == fence {
			s.pending[i].n += n
			return
		}
	}
	if s.releasing > 0 {
		s.late = append(s.late, lateGrant{fence, n})
		return
	}
	s.owed += n
}

// unsureLate forgets the late grants (see lateLocked) into a holding that
// a Release of the handle naming holding named (nil: none, any holding)
// may have ended, its outcome unknown: as the permits of a holding such a
// Release was sent for, they are not owed.
func (s *Semaphore) unsureLate(named *hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.late = slices.DeleteFunc(s.late, func(l lateGrant) bool { return named == nil || named.fence == l.fence })
	for _, f := range s.flights {
		if named == nil {
			f.unsure = true
		} else {
			f.ended = append(f.ended, named.fence)
		}
	}
}

// A handleFlight is an Acquire or TryAcquire call through the handle
// (without an owner) in flight: the fencing tokens of the handle's
// holdings that releases ended (or, their outcome unknown, may have
// ended) meanwhile, of which a grant the call learns late may be one
// (see held).
type handleFlight struct {
	ended  []uint64
	unsure bool // a Release naming no holding got no reply meanwhile
}

// flightBegin counts an Acquire of the handle in flight; flightEnd ends it.
func (s *Semaphore) flightBegin(f *handleFlight) {
	s.mu.Lock()
	s.flights = append(s.flights, f)
	s.mu.Unlock()
}

func (s *Semaphore) flightEnd(f *handleFlight) {
	s.mu.Lock()
	s.flights = slices.DeleteFunc(s.flights, func(g *handleFlight) bool { return g == f })
	s.mu.Unlock()
}

// ended forgets tok's holding with fencing token fence, which the server
// ended with a release of n permits.
func (s *Semaphore) ended(owned bool, tok string, fence uint64, n int64) {
	if owned {
		k := holdKey{s.keys[0], tok}
		s.c.ownerEnded(k, fence)
		if h := s.c.lookupHold(k); h != nil && h.fence == fence {
			s.c.dropHold(k, h, n)
			h.release()
		}
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone = max(s.gone, fence)
	for _, f := range s.flights {
		f.ended = append(f.ended, fence)
	}
	s.late = slices.DeleteFunc(s.late, func(l lateGrant) bool { return l.fence == fence })
	if s.cur != nil && s.cur.fence == fence {
		s.cur.release()
		s.cur, s.curN = nil, 0
	}
	s.pending = slices.DeleteFunc(s.pending, func(p pendingHolding) bool {
		if p.h.fence == fence {
			p.h.release()
			return true
		}
		return false
	})
}

// lostLocked marks h, a holding of the handle with n permits, lost: its
// lease says so, and its permits are still the handle's to release, so the
// next Releases settle them (ErrLeaseLost) before touching a later holding.
// s.mu must be held.
func (s *Semaphore) lostLocked(h *hold, n int64) {
	if _, un, _ := h.takeUnsure(); un > 0 {
		// A Release of all its permits was sent, and most likely ended
		// it: its caller was told the outcome is unknown, and owes
		// nothing.
		h.release()
		s.owed += max(n-un, 0)
		return
	}
	h.lease.MarkLost()
	s.owed += n
}

// sameHolding reports whether h and g (nil: none) are records of one
// holding of the handle: the same fencing token. A holding reported lost
// that an Acquire joined since (Redis kept it) is recorded afresh, with a
// new lease (see held), and Releases sent for the earlier record end or
// lower the holding of the new one.
func sameHolding(h, g *hold) bool {
	return h == g || h != nil && g != nil && h.fence == g.fence
}

// whole reports whether n is every permit of h (nil: none) that this
// process knows of: those of the owner's holding h, or of the handle's.
func (s *Semaphore) whole(owned bool, h *hold, n int64) bool {
	switch {
	case h == nil:
		return false
	case owned:
		return h.permits.Load() == n
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sameHolding(s.cur, h) {
		return s.curN == n
	}
	for _, p := range s.pending {
		if sameHolding(p.h, h) {
			return p.n == n
		}
	}
	return false
}

// recordOf returns the record of holding h (nil: none) of holder tok
// (owned) or of the handle that the holder's bookkeeping keeps now: for
// an owner, the holding recorded for it if it is of the same holding (an
// Acquire joined h reported lost, see base.ownerHoldLocked), and for the
// handle its current or pending record of the same holding (see
// sameHolding); h if there is none.
func (s *Semaphore) recordOf(owned bool, tok string, h *hold) *hold {
	if h == nil {
		return h
	}
	if owned {
		s.c.mu.Lock()
		defer s.c.mu.Unlock()
		return s.ownerRecordLocked(tok, h)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sameHolding(s.cur, h) {
		return s.cur
	}
	for _, p := range s.pending {
		if sameHolding(p.h, h) {
			return p.h
		}
	}
	return h
}

// ownerRecordLocked is recordOf for owner tok, with s.c.mu held.
func (s *Semaphore) ownerRecordLocked(tok string, h *hold) *hold {
	if r := s.c.holds[holdKey{s.keys[0], tok}]; sameHolding(r, h) {
		return r
	}
	return h
}

// ownerReleased notes a Release of n permits of h, owner tok's holding,
// that left it with left permits in Redis (left < 0: its outcome is
// unknown, and they count as released). If an Acquire joined h reported
// lost meanwhile, the holding's record is a new one, which counts the
// Acquire's permits whether its script ran before this Release's or after
// it: n are taken from it, and the count Redis told is not kept.
func (s *Semaphore) ownerReleased(tok string, h *hold, n, left int64) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if r := s.ownerRecordLocked(tok, h); r != h || left < 0 {
		for {
			p := r.permits.Load()
			if r.permits.CompareAndSwap(p, max(p-n, 0)) {
				return
			}
		}
	}
	h.permits.Store(left)
}

// setUnsure records on h a Release of all its n permits, sent with call
// id, whose outcome is unknown, and whether h's lease was reported lost
// before it was sent.
func (h *hold) setUnsure(id string, n int64, lost bool) {
	h.idMu.Lock()
	h.unsureID, h.unsureN, h.lostAtSend = id, n, lost
	h.idMu.Unlock()
}

// takeUnsure returns and forgets the Release setUnsure recorded on h ("",
// 0 if none), and whether the lease was lost before it was sent.
func (h *hold) takeUnsure() (string, int64, bool) {
	h.idMu.Lock()
	defer h.idMu.Unlock()
	id, n, lost := h.unsureID, h.unsureN, h.lostAtSend
	h.unsureID, h.unsureN = "", 0
	return id, n, lost
}

// lost forgets h, a holding that Releases of n permits in all (this one's,
// and an earlier one's of unknown outcome) found gone. Without an owner,
// the permits of h that they did not settle stay owed.
func (s *Semaphore) lost(owned bool, tok string, h *hold, n int64) {
	h.lease.MarkLost()
	if owned {
		s.c.dropHold(holdKey{s.keys[0], tok}, h, n)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sameHolding(s.cur, h) {
		s.cur.lease.MarkLost() // h's record afresh (see held)
		s.owed += max(s.curN-n, 0)
		s.cur, s.curN = nil, 0
	}
	s.pending = slices.DeleteFunc(s.pending, func(p pendingHolding) bool {
		if sameHolding(p.h, h) {
			p.h.lease.MarkLost()
			s.owed += max(p.n-n, 0)
			return true
		}
		return false
	})
}

// unsettled forgets n permits of h (nil: none recorded), the holding of
// tok, whose Release got no reply however often it was sent, and whose
// caller left (see callerLeft): they count as released, and a holding left
// with none ends in this process, its lease lost and no longer renewed.
// (If the Release never arrived, they stay held in Redis until the
// holding's TTL.)
func (s *Semaphore) unsettled(owned bool, tok string, h *hold, n int64) {
	if h == nil {
		return
	}
	if owned {
		if h.permits.Add(-n) <= 0 {
			s.c.dropHold(holdKey{s.keys[0], tok}, h, 0)
			h.lease.MarkLost()
		}
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sameHolding(s.cur, h) {
		if s.curN -= n; s.curN <= 0 {
			h.lease.MarkLost()
			s.cur.lease.MarkLost() // h's record afresh (see held)
			s.cur, s.curN = nil, 0
		}
	}
	for i := range s.pending {
		if sameHolding(s.pending[i].h, h) {
			s.pending[i].n -= n
		}
	}
	s.pending = slices.DeleteFunc(s.pending, func(p pendingHolding) bool {
		if sameHolding(p.h, h) && p.n <= 0 {
			h.lease.MarkLost()
			p.h.lease.MarkLost()
			return true
		}
		return false
	})
}

// unsurePart counts n permits of h, a holding of the handle, that a
// Release of some of its permits was sent for and got no reply, as
// released: the handle's Releases never settle them.
func (s *Semaphore) unsurePart(h *hold, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sameHolding(s.cur, h) {
		s.curN = max(s.curN-n, 0)
	}
	for i := range s.pending {
		if sameHolding(s.pending[i].h, h) {
			s.pending[i].n = max(s.pending[i].n-n, 0)
		}
	}
}

// current returns the handle's holding (nil if none).
func (s *Semaphore) current() *hold {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}
