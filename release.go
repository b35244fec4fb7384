package dsync

// Releases: Unlock, RUnlock and Release of a hold recorded in the process,
// one path for every primitive (see unlockOwner, unlockSlot and settle).

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// unlockCall returns the call id of an unlock of h: the id of an earlier
// unlock whose reply was lost, so that a retry is recognised, or a new one;
// and whether h's lease was reported lost before the unlock of that id was
// first sent. (Lost since, the hold's end the renewer found may be that
// unlock's own: a retry that finds it released by that unlock did
// release it.)
func (h *hold) unlockCall() (string, bool) {
	h.idMu.Lock()
	defer h.idMu.Unlock()
	if h.unlockID == "" {
		h.unlockID = newCallID()
		h.lostAtSend = h.lost()
	}
	return h.unlockID, h.lostAtSend
}

// unlockPending reports whether an unlock of h got no reply: its outcome
// is unknown, and a repeat of it reuses its id (see unlockCall).
func (h *hold) unlockPending() bool {
	h.idMu.Lock()
	defer h.idMu.Unlock()
	return h.unlockID != ""
}

// unlocked forgets the id of an unlock of h that got its reply.
func (h *hold) unlocked() {
	h.idMu.Lock()
	h.unlockID = ""
	h.idMu.Unlock()
}

// fenceArg is the fencing token (or read hold id) an unlock of h names: the
// hold it ends, and no later one of the same holder; "" for none.
func (h *hold) fenceArg() any {
	switch {
	case h == nil:
		return argNone
	case h.holdID.fenceArg != nil:
		return h.holdID.fenceArg
	}
	return h.fence
}

// tokArg returns holder token tok as a script argument, boxed by the call
// that took h if h is tok's.
func (h *hold) tokArg(tok string) any {
	if h != nil && h.holdID.tokArg != nil && h.tok == tok {
		return h.holdID.tokArg
	}
	return tok
}

// A releaser runs a primitive's release script for holder tok with call
// id, ending hold h (nil if no hold is recorded in this process or owed
// by it: see fenceArg and owedHold). Its reply: 1 released, 2 still held
// (a count went down), 0 not held.
type releaser func(ctx context.Context, tok, id string, h *hold) (int64, error)

// unlockOwner releases one level of the hold of the owner recorded under k
// (on a ctx from settle),
// held in Redis as tok: h under client reentrancy (local), where the
// process counts the levels and only the last one gets here, else the hold
// recorded, its releases one at a time.
func (b *base) unlockOwner(ctx context.Context, k holdKey, tok string, run releaser, local bool, h *hold) error {
	if !local {
		if h = b.lockedHold(k); h != nil {
			defer h.relMu.Unlock()
			if rep := b.takeRepeat(h); rep != nil {
				return b.repeatUnlock(ctx, h, rep, tok, run)
			}
		}
	}
	// A lease reported lost before the release (its local deadline passed)
	// stays lost, though the hold may still be there to release. (One the
	// renewer finds gone during the release, which may have ended it
	// itself, is as the release's reply says.)
	id, lostBefore := newCallID(), false
	named := h
	if h != nil {
		id, lostBefore = h.unlockCall()
	} else {
		// None on record: a level of an ended hold that the owner still
		// owes, if any, names that hold.
		named = b.owedHold(k, 1)
	}
	b.beginUnlock(h)
	h.beginRelease()
	defer h.endRelease()
	r, err := b.runRelease(ctx, local, func(ctx context.Context) (int64, error) { return run(ctx, tok, id, named) })
	b.endUnlock(h, err == nil && r == 1)
	if err != nil {
		if unknownOutcome(err) {
			switch {
			case h == nil:
				if named != nil && !callerLeft(ctx) {
					// The caller may repeat it: the repeat names the
					// same hold.
					b.reowe(k, named, 1)
				}
			case local:
				b.unsettled(k, h)
			case callerLeft(ctx):
				b.unsettledLevel(k, h)
			default:
				b.keepRepeat(k, h)
			}
		}
		// The outcome is unknown: keep the hold, and let a retry reuse id.
		return err
	}
	if h == nil {
		// Taken by another process of this owner, which renews it (or
		// the ended hold named, still there in another process).
		switch r {
		case 1, 2:
			return nil
		case 0:
			return ErrNotHeld
		}
		return replyError("unlock", r)
	}
	h.unlocked()
	switch r {
	case 1:
		b.dropHold(k, h, 1)
		h.release()
		if lostBefore {
			return ErrLeaseLost
		}
		return nil
	case 2:
		if b.lowerLevel(h) {
			// Another process re-entered with this owner and renews the
			// rest of the hold.
			b.dropHold(k, h, 0)
			h.release()
		}
		if lostBefore {
			// A level of a hold reported lost: so is the Unlock of each.
			return ErrLeaseLost
		}
		return nil
	case 0:
		b.dropHold(k, h, 1)
		h.lease.MarkLost()
		return ErrLeaseLost
	}
	return replyError("unlock", r)
}

// keepRepeat notes that h, the owner's hold recorded under k when an
// unlock of it was sent, got no reply to it, its caller still there: if
// a later hold of the owner replaced h meanwhile (ownerHold, while the
// unlock was in flight, found h ended in Redis: see hold.replaced), the
// unlock may be what ended it, and the owner's next unlock, which finds
// that later hold, is its repeat (see hold.repeat), as when the later hold
// is taken after the unlock returned.
func (b *base) keepRepeat(k holdKey, h *hold) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if nh := b.holds[k]; h.replaced && !h.holding && nh != nil && nh != h && nh.repeat == nil {
		nh.repeat = h
	}
}

// takeRepeat returns the replaced hold whose unlock h, the owner's recorded
// hold, is to repeat (see hold.repeat), and forgets it; nil if none.
func (b *base) takeRepeat(h *hold) *hold {
	b.mu.Lock()
	defer b.mu.Unlock()
	rep := h.repeat
	h.repeat = nil
	return rep
}

// repeatUnlock is the owner's unlock (on a ctx from settle) that repeats
// the unlock of rep, a hold of the owner that h replaced, which got no
// reply: it is sent again under its call id, naming rep, and answers as
// that unlock's first run did, ending nothing else. The level it settles
// is one of those h took over from rep (see owe).
func (b *base) repeatUnlock(ctx context.Context, h, rep *hold, tok string, run releaser) error {
	id, lostBefore := rep.unlockCall()
	r, err := b.runRelease(ctx, false, func(ctx context.Context) (int64, error) { return run(ctx, tok, id, rep) })
	if err != nil {
		if !unknownOutcome(err) {
			return err
		}
		if !callerLeft(ctx) {
			// Still unknown: the owner's next unlock repeats it again.
			b.mu.Lock()
			if h.repeat == nil {
				h.repeat = rep
			}
			b.mu.Unlock()
			return err
		}
		// Its caller left, and no reply came however often it was sent:
		// the level counts as released (see unsettledLevel).
	}
	rep.unlocked()
	b.mu.Lock()
	if h.owes > 0 {
		h.owes--
	}
	b.mu.Unlock()
	if err != nil {
		return err
	}
	switch r {
	case 1, 2:
		if lostBefore {
			return ErrLeaseLost
		}
		return nil
	case 0:
		return ErrLeaseLost
	}
	return replyError("unlock", r)
}

// unlockSlot releases the hold of a handle's slot and unlocks the handle
// (on a ctx from settle).
func (b *base) unlockSlot(ctx context.Context, sl *slot, run releaser) error {
	h := sl.get()
	if h == nil {
		return ErrNotHeld
	}
	// As in unlockOwner: a lease reported lost before the release stays
	// lost.
	id, lostBefore := h.unlockCall()
	h.beginRelease()
	defer h.endRelease()
	r, err := run(ctx, h.tok, id, h)
	if err != nil && unknownOutcome(err) && callerLeft(ctx) {
		// Its caller left: the release settles its outcome alone.
		r, err = b.retryRelease(ctx, func(ctx context.Context) (int64, error) { return run(ctx, h.tok, id, h) }, r, err)
		if err != nil && unknownOutcome(err) {
			// No reply however often it was sent: the handle is unlocked
			// as its caller was told, and the hold, no longer renewed,
			// ends in Redis by this release or at its TTL.
			h.unlocked()
			if sl.clear(h) {
				sl.leave()
			}
			h.lease.MarkLost()
			return err
		}
	}
	if err != nil {
		return err
	}
	h.unlocked()
	if r != 0 && r != 1 && r != 2 {
		return replyError("unlock", r)
	}
	if !sl.clear(h) {
		// Another Unlock of the same hold came first.
		return ErrNotHeld
	}
	defer sl.leave()
	if r == 0 || lostBefore {
		// Gone, or reported lost before (its local deadline passed) though
		// still there to release: a lost lease stays lost.
		h.lease.MarkLost()
		return ErrLeaseLost
	}
	h.release()
	return nil
}

// settle runs rl.f(ctx, a), an Unlock or Release of a hold, on a ctx that a
// cancellation cannot cut short, and returns its error, or ctx.Err() if
// ctx ends first: the release then goes on in the background, owned by
// the Client (b) and bounded by the Redis client's own timeouts, and
// completes (its bookkeeping included) as if the caller had waited
// (unless it completes within cleanupGrace of ctx's end, whose outcome the
// caller then gets). A ctx already done is a ctx that ended at the call:
// the release starts all the same, and the caller has its outcome if it
// comes within cleanupGrace. So a release is never lost to a cancellation,
// and the caller still returns when its ctx ends. (f is a plain function and a its
// arguments, so that a ctx that cannot end costs no allocation.)
func settle[A any](b *base, ctx context.Context, a A, rl *settler[A]) error {
	f := rl.f
	switch {
	case ctx.Done() == nil:
		return f(ctx, a)
	case !b.releases.add():
		// Closed (after the call's own check: Close came in between).
		// Nothing runs in the Client's background any more, so the
		// release runs on its own, bounded as a detached release is, and
		// the caller waits for it as long as its ctx lets it (and
		// cleanupGrace), not for that bound: with Redis silent, it
		// returns at its deadline, and the release ends at the bound.
		return settleClosed(ctx, a, f)
	}
	r, _ := rl.calls.Get().(*releaseCall[A])
	if r == nil {
		r = &releaseCall[A]{done: make(chan struct{}, 1)}
	}
	// A ctx of its own: goroutines the release leaves behind (a quorum's
	// stragglers) may use it after r is used again.
	r.fctx = &fateCtx{parent: ctx}
	r.b, r.ctx, r.a, r.rl = b, r.fctx, a, rl
	go r.run()
	if awaitCall(ctx, r.done) {
		return r.reuse()
	}
	// A release that ctx's end caught in flight usually has its reply in a
	// moment: its outcome is worth cleanupGrace more.
	t := getTimer(cleanupGrace)
	defer putTimer(t)
	select {
	case <-r.done:
		return r.reuse()
	case <-t.C:
		if r.fctx.fate.CompareAndSwap(fateOpen, fateLeft) {
			// The release goes on without its caller, and settles its
			// outcome alone (see callerLeft); r is not used again.
			return ctx.Err()
		}
		// The release has told its outcome to the caller: it has no
		// more to send, and is over in a moment.
		<-r.done
		return r.reuse()
	}
}

// settleClosed is settle for a Client closed after the call began: f runs
// in a goroutine of its own, on a detached ctx (releaseTimeout), and the
// caller has its outcome if it comes before ctx ends, or within
// cleanupGrace after.
func settleClosed[A any](ctx context.Context, a A, f func(context.Context, A) error) error {
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		dctx, cancel := detached(ctx)
		defer cancel()
		err = f(dctx, a)
	}()
	if awaitCall(ctx, done) {
		return err
	}
	t := getTimer(cleanupGrace)
	defer putTimer(t)
	select {
	case <-done:
		return err
	case <-t.C:
		return ctx.Err()
	}
}

// The fate of a release's outcome (see settle): its caller waits for it
// (fateOpen), it goes to the caller (fateTold), or the caller returned
// without it, its ctx ended (fateLeft).
const (
	fateOpen int32 = iota
	fateTold
	fateLeft
)

type fateKey struct{}

// A fateCtx is the ctx of a release that runs for a caller that may
// leave (see settle): what context.WithoutCancel(parent) is (no deadline,
// never done, parent's values), in one allocation with the release's
// fate, its Value(fateKey{}).
type fateCtx struct {
	parent context.Context
	fate   atomic.Int32
}

func (c *fateCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *fateCtx) Done() <-chan struct{}       { return nil }
func (c *fateCtx) Err() error                  { return nil }

func (c *fateCtx) Value(k any) any {
	if k == (fateKey{}) {
		return &c.fate
	}
	// Through WithoutCancel, which hides parent's cancellation from
	// context.Cause too (a key of the context package). Only the fate is
	// asked for on the release's path.
	return context.WithoutCancel(c.parent).Value(k)
}

// callerLeft reports whether the caller of the release running on ctx
// returned without its outcome (its ctx ended), when that outcome is
// unknown (no reply came): the caller was told that the release
// completes in the background and will not repeat it, so the release is
// sent again under its call id until a reply tells the outcome (see
// retryRelease), and if none does, what the caller holds is forgotten as
// if it had been released, never kept for a repeat that is not coming
// (it would take the caller's next unlock for that repeat). Otherwise the
// outcome is the caller's from here on: it waits for it, and may repeat
// the release.
func callerLeft(ctx context.Context) bool {
	f, _ := ctx.Value(fateKey{}).(*atomic.Int32)
	return f != nil && !f.CompareAndSwap(fateOpen, fateTold) && f.Load() == fateLeft
}

// A settler is a release function (an Unlock or Release of one kind of
// hold), with the releaseCalls that ran it kept for the next ones (see settle).
type settler[A any] struct {
	f     func(context.Context, A) error
	calls sync.Pool
}

// A releaseCall is a release that runs in a goroutine of its own (see
// settle). Its done channel has room for the one value run sends when the
// release is over, so that the call and its channel are used again once
// the caller received it; a call whose caller gave up on it is left to the
// garbage collector.
type releaseCall[A any] struct {
	b    *base
	ctx  context.Context
	a    A
	rl   *settler[A]
	err  error
	done chan struct{}
	fctx *fateCtx // ctx, with the outcome's fate (see callerLeft)
}

func (r *releaseCall[A]) run() {
	b := r.b
	defer b.releases.end()
	r.err = r.rl.f(r.ctx, r.a)
	r.done <- struct{}{} // r is the caller's from here on
}

// reuse returns r's outcome and keeps r for its settler's next call; r's
// run is over (the caller received from done).
func (r *releaseCall[A]) reuse() error {
	err, rl := r.err, r.rl
	*r = releaseCall[A]{done: r.done}
	rl.calls.Put(r)
	return err
}

// runRelease runs a release, run. Under client reentrancy (local) the
// owner's Lock calls wait until the release of its last level is over, and
// then must not re-enter a hold it may have ended: a release whose outcome
// is unknown (no reply came) is sent again, under the same call id, until
// a reply tells the outcome, for releaseTimeout at most (see unsettled for
// what follows if none does).
func (b *base) runRelease(ctx context.Context, local bool, run func(ctx context.Context) (int64, error)) (int64, error) {
	r, err := run(ctx)
	if err == nil || !unknownOutcome(err) || !local && !callerLeft(ctx) {
		return r, err
	}
	return b.retryRelease(ctx, run, r, err)
}

// retryRelease sends again a release whose outcome is unknown, under the
// same call id (a repeat within the replay window answers as the first run
// did), until a reply tells the outcome, for releaseTimeout at most or
// until the Client closes, and returns the last reply (r and err, its
// first, if it sent none).
func (b *base) retryRelease(ctx context.Context, run func(ctx context.Context) (int64, error), r int64, err error) (int64, error) {
	end := time.Now().Add(releaseTimeout)
	for wait := minRetry; time.Now().Before(end); wait = min(2*wait, time.Second/2) {
		t := getTimer(min(wait, time.Until(end)))
		select {
		case <-t.C:
		case <-b.closed:
			putTimer(t)
			return r, err
		}
		putTimer(t)
		if r, err = run(ctx); err == nil || !unknownOutcome(err) {
			break
		}
	}
	return r, err
}

// unsettled ends h, the hold recorded under k whose last release (client
// reentrancy) got no reply however often it was sent: it may be gone in
// Redis, so it is reported lost and forgotten, and the owner's next Lock
// asks Redis instead of re-entering it. If the release never arrived, the
// hold expires at its TTL, no longer renewed.
func (b *base) unsettled(k holdKey, h *hold) {
	b.dropHold(k, h, 1)
	h.lease.MarkLost()
}

// unsettledLevel forgets one level of h, the hold recorded under k, whose
// release got no reply however often it was sent, and whose caller left
// (see callerLeft): the level counts as released, and the release's call
// id is forgotten, so that the owner's next unlock is a call of its own.
// With the last level, h ends as unsettled says. (If the release never
// arrived, the level it was for stays in Redis until the hold's TTL: the
// owner's last unlock lowers the count there to one and ends the renewal.)
func (b *base) unsettledLevel(k holdKey, h *hold) {
	h.unlocked()
	if b.lowerLevel(h) {
		b.unsettled(k, h)
	}
}

// lowerLevel counts one level of h less and reports whether it was the
// last.
func (b *base) lowerLevel(h *hold) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	h.count--
	return h.count <= 0
}

// unknownOutcome reports whether err, the error of a script call, leaves
// unknown whether the script ran: no reply came (the connection failed or
// timed out, ctx ended). A reply, even an error (the script failed, or did
// not run: NOSCRIPT, BUSY, OOM), tells the outcome, and so does a call
// that was never sent (the Client closed, or the Redis client: its user
// closed it, redis.ErrClosed).
func unknownOutcome(err error) bool {
	var re redis.Error
	return !errors.As(err, &re) && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrInvalid) &&
		!errors.Is(err, redis.ErrClosed)
}
