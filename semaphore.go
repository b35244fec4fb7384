package dsync

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/dsync-go/dsync/internal/keys"
)

// A Semaphore is a weighted semaphore shared by every process that names it,
// the distributed twin of [golang.org/x/sync/semaphore.Weighted]: at most
// size permits are held at once, in all processes together. Get one with
// [Client.Semaphore]; a Semaphore handle is safe for concurrent use and
// cheap, so make one where needed.
//
// Without an owner in ctx the handle is the holder, like a Weighted value
// shared by goroutines: every Acquire through the handle adds to one holding
// and any goroutine may Release permits of it. With an owner (see
// [WithOwner]) the owner is the holder, in any process: its Acquires add up,
// and only it may release them.
//
// Unlike Weighted, every holding has a lease (see [TTL]): the Client renews
// it while permits are held, and the permits of a holder that dies come back
// when its lease runs out. Each fresh holding (from none to some permits)
// gets a fencing token larger than every earlier one of the name
// ([Lease.Token]); adding permits to a holding keeps its token.
//
// Waiters are served in arrival order across processes, as in Weighted: a
// large request first in line is served before later small ones, even if
// they would fit. Permits freed by a release are handed straight to the
// waiters first in line that fit, which then hold them without another round
// trip. Unlike Weighted, Acquire and TryAcquire reject n > size at once with
// [ErrInvalid] (Weighted's Acquire would block until ctx is done), and all
// handles of one name must agree on its size ([ErrSizeMismatch]). Sizes are
// at most [MaxSemaphoreSize].
type Semaphore struct {
	handle // the Client's base, configuration, bad input
	c      *Client
	name   string
	size   int64
	keys   []string // state hash, fence hash, holders, queue, queue data, call ids

	// Script arguments boxed once per handle.
	kargs            []any // key count and keys
	rkeys            []string
	sizeArg          any
	ttlArg           any
	chanArg          any
	queueArg, tryArg any    // the acquire script's ARGV[6] for Acquire and TryAcquire
	what             string // how errors name the Semaphore

	mu     sync.Mutex
	tok    string // the handle's holder token, made by its first Acquire
	tokArg any    // tok boxed once
	cur    *hold  // the handle's holding, without an owner in ctx
	curN   int64  // permits in cur
	owed   int64  // permits of the handle's lost holdings that no Release has settled
	// releasing counts the handle's Release calls in flight; pending are
	// holdings a new one replaced meanwhile, which one of those calls may
	// have ended (else they were lost).
	releasing int
	pending   []pendingHolding
	late      []lateGrant     // grants into ended holdings, learned meanwhile (see lateLocked)
	flights   []*handleFlight // the handle's Acquire calls in flight
	gone      uint64          // fencing token of the handle's last holding known to have ended
}

// MaxSemaphoreSize is the largest size of a [Semaphore]: 2^52. The scripts
// count permits in Lua numbers (doubles), which are exact integers only up
// to 2^53, and a sum of two counts must stay within that; a larger size
// would let rounding hand out more permits than the size.
const MaxSemaphoreSize = 1 << 52

// Semaphore returns a handle on the semaphore called name, which allows size
// permits at once. Options override the Client's defaults for this handle.
// An empty name, a size ≤ 0 or above [MaxSemaphoreSize] or a bad option
// makes every call on the handle fail with [ErrInvalid].
func (c *Client) Semaphore(name string, size int64, opts ...Option) *Semaphore {
	s := &Semaphore{handle: c.shared().newHandle(name, opts), c: c, name: name, size: size}
	if size <= 0 || size > MaxSemaphoreSize {
		s.err = fmt.Errorf("%w: semaphore size %d, want 1 to %d", ErrInvalid, size, int64(MaxSemaphoreSize))
	}
	k := keys.ForSemaphore(s.cfg.prefix, name)
	s.keys = k.Keys()
	s.kargs = boxKeys(s.keys)
	s.rkeys = []string{s.keys[0], s.keys[2]}
	s.sizeArg = size
	s.ttlArg = ms(s.cfg.ttl)
	s.chanArg = k.Channel()
	s.queueArg, s.tryArg = argYes, argNo
	if s.cfg.interval < 0 || s.cfg.maxHold > 0 {
		// A lease that is not to be extended (FixedLease, MaxHold): permits
		// added to a holding leave its deadline in Redis where it was.
		s.queueArg, s.tryArg = "3", "2"
	}
	s.what = "Semaphore " + strconv.Quote(name)
	return s
}

func (s *Semaphore) check() error {
	if s == nil {
		return fmt.Errorf("%w: nil Semaphore", ErrInvalid)
	}
	return s.handle.check()
}

func (s *Semaphore) checkN(n int64) error {
	if n <= 0 || n > s.size {
		return fmt.Errorf("%w: n = %d, want 1 to %d (the size)", ErrInvalid, n, s.size)
	}
	return nil
}

func (s *Semaphore) mismatch(inForce int64) error {
	return fmt.Errorf("%w: %d, in force %d", ErrSizeMismatch, s.size, inForce)
}

// Acquire acquires n permits of s, blocking until they are available or ctx
// is done. On success, returns nil; the permits are held until released,
// their lease renewed by the Client. On failure, returns an error for which
// errors.Is(err, ctx.Err()) holds (or a Redis, [ErrClosed] or
// [ErrSizeMismatch] error) and leaves the semaphore unchanged, also when the
// server granted the permits but the reply was lost (unless Redis stays
// unreachable for more than 5 s: see the package documentation). If ctx is
// already done, Acquire returns its error without trying.
//
// Unlike Weighted.Acquire, n > size is an error at once ([ErrInvalid]), as
// is n ≤ 0.
func (s *Semaphore) Acquire(ctx context.Context, n int64) error {
	_, err := s.acquire(ctx, n, true)
	return err
}

// TryAcquire acquires n permits of s without blocking and reports whether it
// succeeded. It fails, leaving the semaphore unchanged, if fewer than n
// permits are free or waiters are queued. An error means the attempt could
// not be made or its outcome is unknown; then nothing is left held.
func (s *Semaphore) TryAcquire(ctx context.Context, n int64) (bool, error) {
	return s.acquire(ctx, n, false)
}

func (s *Semaphore) acquire(ctx context.Context, n int64, wait bool) (bool, error) {
	if err := s.check(); err != nil {
		return false, err
	}
	if err := s.checkN(n); err != nil {
		return false, err
	}
	tok, owned, err := callOwner(ctx)
	if err != nil {
		return false, err
	}
	var tokArg any = tok
	if !owned {
		tok, tokArg = s.handleToken()
	}
	if !s.c.begin() {
		return false, ErrClosed
	}
	defer s.c.end()
	// Hand-overs name the call, not the holder: one holder may have several
	// calls waiting.
	sc := &semCall{s: s, tok: tokArg, owned: owned, n: n}
	if owned {
		// A release of the owner that ends the holding this call's
		// permits go into, answered before this call, is noted for it.
		k := holdKey{s.keys[0], tok}
		s.c.ownerFlightBegin(k)
		defer s.c.ownerFlightEnd(k)
	} else {
		// The same for the handle.
		s.flightBegin(&sc.fl)
		defer s.flightEnd(&sc.fl)
	}
	sc.acquisition = acquisition{ch: s.chanArg.(string), to: newAddressee(tok, newCallID(), s.c.notify.inboxFor(owned)), ttl: s.cfg.ttl, timed: true}
	g, start, err := s.c.take(ctx, &sc.acquisition, sc, wait)
	if err == nil && g.kind == final {
		err = g.err
	}
	if err != nil || (g.kind != taken && g.kind != handed) {
		return false, err
	}
	if s.cfg.replicas > 0 {
		// With WaitReplicas, make sure the permits reached the replicas.
		if err := s.c.replicated(ctx, &s.cfg, semRenew, s.rkeys, tokArg, s.ttlArg, holdID{fence: g.fence, fenceArg: g.fenceArg}.arg()); err != nil {
			s.c.cleanup(ctx, sc)
			return false, err
		}
	}
	s.held(holdID{tok: tok, tokArg: tokArg, fence: g.fence, fenceArg: g.fenceArg}, owned, n, start, &sc.fl)
	if f := s.c.semTook; f != nil {
		f(ctx, g.fence)
	}
	return true, nil
}

// A semCall is one Acquire or TryAcquire call, as the engine drives it (see
// acquirer).
type semCall struct {
	acquisition
	s     *Semaphore
	tok   any // the holder token, boxed once for the call's scripts
	owned bool
	n     int64
	cmd   []any // the acquire script's command, built by the first attempt
	queue bool  // whether cmd takes a queue place
	fl    handleFlight
}

// attempt runs the acquire script once.
func (sc *semCall) attempt(ctx context.Context, queue bool) (grant, error) {
	s := sc.s
	if sc.cmd == nil || sc.queue != queue {
		q := s.tryArg
		if queue {
			q = s.queueArg
		}
		sc.cmd, sc.queue = scriptCall(semAcquire, s.kargs, sc.tok, sc.n, s.sizeArg, s.ttlArg, sc.to.id, q, fenceIdleArg, s.chanArg, sc.to.secret, argNone), queue
	}
	r, err := s.c.acquirePair(ctx, &s.cfg, semAcquire, "semaphore acquire", sc.cmd)
	if err != nil {
		return grant{}, err
	}
	if g, ok, err := decodeGrant(r, true, s.what); ok {
		return g, err
	}
	if r.code == 4 {
		// The size differs (a place lapsed and another size took over).
		return grant{kind: final, err: s.mismatch(r.v)}, nil
	}
	return grant{}, replyError("semaphore acquire", r.code)
}

// abandon undoes whatever a failed Acquire or TryAcquire call may have done
// on the server: its place in the queue, permits it took or was handed
// whose reply was lost.
func (sc *semCall) abandon(ctx context.Context) error {
	s := sc.s
	r, err := s.c.eval(ctx, semAbandon, s.kargs, sc.tok, sc.n, sc.to.id, fenceIdleArg, s.chanArg).Int64Slice()
	if err == nil && len(r) == 2 && r[0] == 0 && r[1] > 0 {
		s.ended(sc.owned, sc.to.tok, uint64(r[1]), sc.n)
	}
	return err
}

func (sc *semCall) restart() { sc.to, sc.cmd = sc.to.next(newCallID()), nil }

// Release releases n permits held by ctx's owner or, without an owner in
// ctx, by the handle; when none remain, the holding and its lease end.
// Permits freed go to the waiters first in line that fit. Release runs even
// if ctx is already done; if ctx ends before its outcome is known (or,
// already done, the outcome does not come within a few ms), Release
// returns ctx's error then and the release completes in the background, as
// if the caller had waited (it is not to be repeated). It returns
// [ErrNotHeld] if the holder holds no permits of s, an error matching both
// ErrNotHeld and [ErrInvalid] if it holds fewer than n (Weighted would
// panic), and [ErrLeaseLost] if its holding was lost before Release; in
// each case nothing is changed. After a Redis error the outcome is unknown;
// when that Release was of every permit of the holding, a Release repeated
// after it returns nil if the first one released them (and the holding's
// Lease ends released, not lost, unless a renewal found the holding gone
// before the repeat: a renewal cannot tell a release from a loss). The
// repeat is known as such only by the holding it finds: if permits were
// acquired for the same holder before it (by another goroutine, through
// the handle or for the owner), it is a Release of n of the permits then
// held, as that goroutine's own Release would be, and if the first one
// did release its permits, it releases n of those acquired since (their
// own Release then finds fewer held). Repeat a Release only where no
// Acquire of the holder can come in between. A Release of only some of
// the holding's permits whose outcome is unknown counts as done: the
// holder no longer counts those permits, and a repeat would release n
// more (what Redis keeps of them, if it never ran, is given back when the
// holding ends or its lease runs out). So does a Release of every permit
// whose outcome is unknown once an Acquire of the same holder joins the
// holding (the same fencing token): it had not ended the holding when the
// Acquire ran, so it was, or its copy on its way will be, a Release of
// only some of its permits.
//
// Without an owner, the permits of a holding of the handle that was lost
// stay the handle's to release, as a sync.Mutex stays locked until its
// Unlock: Releases settle them first, returning ErrLeaseLost, and never
// release for them a permit that a later Acquire through the handle took.
// A Release of n that settles some and releases the rest from the live
// holding also returns ErrLeaseLost. Permits of a holding that a Release
// with an unknown outcome was sent for are not owed. A holding reported
// lost that Redis kept, which an Acquire of the same holder joined (the
// same fencing token), is live again, with or without an owner: its
// permits, the earlier ones too, are held under a new Lease and released
// as those of a live holding (the earlier Lease stays lost).
func (s *Semaphore) Release(ctx context.Context, n int64) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := s.checkN(n); err != nil {
		return err
	}
	tok, owned, err := owner(ctx)
	if err != nil {
		return err
	}
	return settle(&s.c.base, ctx, semReleaseOf{s, tok, owned, n}, semSettler)
}

// semReleaseOf is what a Release of s releases: n permits of owner tok
// (owned) or of the handle.
type semReleaseOf struct {
	s     *Semaphore
	tok   string
	owned bool
	n     int64
}

var semSettler = &settler[semReleaseOf]{f: releaseSem}

// releaseSem is Release, on a ctx from settle.
func releaseSem(ctx context.Context, a semReleaseOf) error {
	s, tok, owned, n := a.s, a.tok, a.owned, a.n
	if owned {
		h := s.c.lockedHold(holdKey{s.keys[0], tok})
		if h != nil {
			defer h.relMu.Unlock()
		}
		return s.release(ctx, tok, true, h, n)
	}
	s.mu.Lock()
	tok, h := s.tok, s.cur
	settled := min(n, s.owed)
	s.owed -= settled
	s.mu.Unlock()
	switch {
	case tok == "":
		return ErrNotHeld
	case settled == n:
		return ErrLeaseLost
	}
	err := s.release(ctx, tok, false, h, n-settled)
	if settled > 0 {
		if err == nil || errors.Is(err, ErrLeaseLost) {
			return ErrLeaseLost
		}
		// Nothing was released: the lost permits stay owed.
		s.mu.Lock()
		s.owed += settled
		s.mu.Unlock()
	}
	return err
}

// release runs the release script for n permits of holder tok, whose
// holding this process knows as h (nil if none).
func (s *Semaphore) release(ctx context.Context, tok string, owned bool, h *hold, n int64) (err error) {
	if !owned {
		s.mu.Lock()
		s.releasing++
		s.mu.Unlock()
		defer func() {
			// Holdings replaced while releases were in flight, and not
			// ended by one of them, were lost.
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.releasing--; s.releasing == 0 {
				for _, p := range s.pending {
					s.lostLocked(p.h, p.n)
				}
				s.pending = nil
				for _, l := range s.late {
					s.owed += l.n // no release ended it: lost
				}
				s.late = nil
			}
		}()
	}
	rec := h
	if !owned {
		rec = nil // a handle's holding: no owner records it
	}
	// A holding reported lost before the release (its local deadline
	// passed) stays lost, though it may still be there to release; one the
	// renewer finds gone during the release is as the reply says.
	lostBefore := h != nil && h.lost()
	// A Release of every permit of the holding whose outcome is unknown
	// is remembered on it (see resolve).
	id, whole := newCallID(), s.whole(owned, h, n)
	named := h
	if h == nil && owned {
		// None on record: permits of an ended holding that the owner
		// still owes, if any, name that holding (see base.owe).
		named = s.c.owedHold(holdKey{s.keys[0], tok}, n)
	}
	s.c.beginUnlock(rec)
	h.beginRelease()
	defer h.endRelease()
	r, err := s.sendRelease(ctx, tok, named, id, n)
	left := err != nil && unknownOutcome(err) && callerLeft(ctx)
	if left {
		// Its caller left: the release settles its outcome alone.
		_, err = s.c.retryRelease(ctx, func(ctx context.Context) (int64, error) {
			var err error
			r, err = s.sendRelease(ctx, tok, named, id, n)
			return r[0], err
		}, 0, err)
	}
	s.c.endUnlock(rec, err == nil && r[0] == 1 && r[1] == 0)
	if err != nil {
		if !owned && unknownOutcome(err) {
			s.unsureLate(named)
		}
		switch {
		case left && unknownOutcome(err):
			s.unsettled(owned, tok, h, n)
		case whole && unknownOutcome(err):
			s.unsure(owned, tok, h, id, n, lostBefore)
		case h == nil && named != nil && unknownOutcome(err):
			// The caller may repeat it: the repeat names the same
			// holding (see base.reowe).
			s.c.reowe(holdKey{s.keys[0], tok}, named, n)
		case !owned && h != nil && unknownOutcome(err):
			// Some of the handle's permits of h: if h is lost, they are
			// not owed (they were sent for), as those of a Release of
			// all are not (see lostLocked).
			s.unsurePart(h, n)
		case owned && h != nil && unknownOutcome(err):
			// Some of the owner's permits of h: they count as released
			// (see Release), as the handle's do.
			s.ownerReleased(tok, h, n, -1)
		}
		return err
	}
	switch r[0] {
	case 1:
		defer func() {
			if lostBefore && err == nil {
				err = ErrLeaseLost
			}
		}()
		if r[1] == 0 {
			s.ended(owned, tok, uint64(r[2]), n)
		} else if owned {
			if h != nil && h.fence == uint64(r[2]) {
				s.ownerReleased(tok, h, n, r[1])
			}
		} else {
			s.mu.Lock()
			if sameHolding(s.cur, h) {
				if s.curN = max(s.curN-n, 0); s.curN == 0 {
					// Redis keeps permits of the holding that the handle
					// does not count: those a Release with an unknown
					// outcome was sent for (not owed, see unsurePart),
					// or those of an Acquire whose reply is still to
					// come (which then records the holding afresh). The
					// handle holds nothing of it: it is no longer
					// renewed, and what is left runs out at its TTL.
					s.cur.release()
					s.cur = nil
				}
			}
			for i := range s.pending {
				if sameHolding(s.pending[i].h, h) {
					s.pending[i].n = max(s.pending[i].n-n, 0)
				}
			}
			s.mu.Unlock()
		}
		return nil
	case 0:
		if h == nil {
			return ErrNotHeld
		}
		uid, un, lostAtSend := s.recordOf(owned, tok, h).takeUnsure()
		if uid != "" && un == n {
			// Perhaps a repeat of that Release (the same n): ask.
			if f, ok := s.resolve(ctx, tok, h, uid, un); ok {
				// An earlier Release of this caller ended the holding;
				// this one is its repeat. (A loss the renewer reported
				// since may be that Release's own doing.)
				s.ended(owned, tok, f, n)
				if lostAtSend {
					return ErrLeaseLost
				}
				return nil
			}
		}
		s.lost(owned, tok, h, n+un)
		return ErrLeaseLost
	case 2:
		return fmt.Errorf("%w: release of %d permits, %d held (%w)", ErrNotHeld, n, r[1], ErrInvalid)
	case 3:
		return s.mismatch(r[1])
	default:
		return replyError("semaphore release", r)
	}
}

// sendRelease runs the release script with call id for n permits of
// holder tok, naming its holding h (nil: none), and returns the reply:
// code, permits left, fencing token. Every release carries a bound, as an
// acquiring attempt does: one that names no holding ends permits of
// whatever holding of the holder it finds (see boundedRelease), and one
// that names its holding and releases some of its permits would release
// as many again of those the holding keeps, delivered once its id is
// forgotten; a copy past the bound changes nothing.
func (s *Semaphore) sendRelease(ctx context.Context, tok string, h *hold, id string, n int64) ([3]int64, error) {
	var r [3]int64
	// The token is boxed here only when no hold carries it boxed: boxing
	// a string allocates.
	var tokArg, name any
	if h != nil {
		tokArg, name = h.tokArg(tok), h.fenceArg()
	} else {
		tokArg, name = tok, argNone
	}
	_, err := bounded(&s.c.clock, "semaphore release", func(bound any) (struct{}, int64, bool, error) {
		cmd := s.c.eval(ctx, semRelease, s.kargs, tokArg, n, s.sizeArg, id, fenceIdleArg, s.chanArg, name, bound)
		if ms, stale := staleReply(cmd.Val()); stale && cmd.Err() == nil {
			return struct{}{}, ms, true, nil
		}
		_, err := replyInts("semaphore release", cmd, r[:])
		return struct{}{}, 0, false, err
	})
	return r, err
}

// resolve learns whether an earlier Release of every permit (n) of
// holding h, sent with call id, whose outcome was unknown and which h is
// now found to have ended, did end it: it sends that Release again, which
// within the replay window repeats its first answer and changes nothing
// (it names h, so it releases no later holding either). It returns h's
// fencing token if that Release ended h.
func (s *Semaphore) resolve(ctx context.Context, tok string, h *hold, id string, n int64) (uint64, bool) {
	r, err := s.sendRelease(ctx, tok, h, id, n)
	if err != nil || r[0] != 1 || r[1] != 0 || uint64(r[2]) != h.fence {
		return 0, false
	}
	return h.fence, true
}

// Lease returns the lease of the permits held by ctx's owner or, without
// an owner in ctx, by the handle. It returns [ErrNotHeld] if there are none.
// It sends nothing to Redis. It is the lease of the holder's current
// holding: with several goroutines acquiring through one handle (or for one
// owner), a call of Lease after an Acquire returns a later holding's lease
// if the one that Acquire took or joined has ended meanwhile (lost, or
// released by another goroutine).
func (s *Semaphore) Lease(ctx context.Context) (*Lease, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.b.leaseOf(ctx, s.keys[0], s.current)
}
