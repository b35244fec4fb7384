package dsync

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/renew"
)

// A Once runs a function exactly once across every process that names it,
// the distributed twin of [sync.Once], and can hand every caller the value
// the run produced. Get one with [Client.Once]; a Once handle is safe for
// concurrent use and cheap, so make one where needed.
//
// One call at a time runs f, holding a run lease that the Client renews
// while f runs. The other calls wait, woken by the end of the run rather
// than by polling, and return only after f has returned. When a run fails,
// the waiting call whose retry reaches Redis first runs f next; there is no
// queue. An owner in ctx (see [WithOwner]) plays no part in a Once.
//
// Unlike sync.Once, a Once is done only when f returns nil. If f returns an
// error or panics, the next waiting call (or the next call to come) runs f.
// If the process running f dies, its lease runs out after the TTL (see
// [TTL]) and a waiting call takes over. A run whose lease is lost is told so
// through f's context, which is then cancelled; f should stop, since
// another call may run f at the same time from then on.
//
// The done mark is the one piece of state dsync keeps on purpose: it is the
// user's data and persists until [Once.Reset], or for the [Period] the Once
// was given. A service that makes a Once per day, per job or per tenant
// should give it a Period, or Redis keeps one small key per name forever.
// Everything else a Once writes expires with the run lease, or a minute
// after the run or the call that wrote it (the ids of recent calls, which
// keep a late copy of a call's script from taking a run nobody renews).
type Once struct {
	handle // the Client's base, configuration, bad input
	c      *Client
	name   string
	keys   []string // run hash, done hash, call ids
	kargs  []any    // keys boxed once (see boxKeys)
	ch     string   // notification channel
	ttlArg any
}

// Once returns a handle on the Once called name. Options override the
// Client's defaults for this handle; [TTL] sets the run lease and [Period]
// how long the done mark lasts. An empty name or a bad option makes every
// call on the handle fail with [ErrInvalid].
//
// A Once and a Mutex of the same name are independent: their keys differ.
func (c *Client) Once(name string, opts ...Option) *Once {
	o := &Once{handle: c.shared().newHandle(name, opts), c: c, name: name}
	k := keys.ForOnce(o.cfg.prefix, name)
	o.keys = k.Keys()
	o.kargs = boxKeys(o.keys)
	o.ch = k.Channel()
	o.ttlArg = ms(o.cfg.ttl)
	return o
}

// Period makes the done mark of a Once expire d after the run that set it
// succeeded: from then on the next call runs f again, so f runs at most once
// per period (a daily report, an hourly cleanup). d must be at least 1 ms.
// The default is no expiry: the done mark stays until [Once.Reset]. Other
// primitives ignore Period.
//
// The period starts when f returns, not on a clock boundary; for a job per
// calendar day, name the Once after the day and give it a Period that
// outlives the day, so the mark is not kept forever.
func Period(d time.Duration) Option {
	return durationOption("Period", d, func(cfg *config) *time.Duration { return &cfg.period })
}

func (o *Once) check() error {
	if o == nil {
		return fmt.Errorf("%w: nil Once", ErrInvalid)
	}
	return o.handle.check()
}

// Do calls f if and only if no call of Do (or [Once.DoValue]) for the same
// name has succeeded yet, in this or any other process, and only one call
// runs f at a time. It waits while another call runs f, until that run ends
// or ctx is done.
//
// Do returns nil once the Once is done: f returned nil in this call, or in
// another call that finished before Do returned. If f returns an error, Do
// returns it to this caller only, and the Once stays not done: a waiting
// call runs f next. If the run lease was lost while f ran, f's error also
// matches [ErrLeaseLost]; a success of f still makes the Once done (f ran
// once, to its end), and Do returns nil, if no other call runs f when it
// ends and none has made the Once done since (one that took over and
// failed does not count); if one has, Do returns nil, and DoValue that
// call's value, as to every caller; and while another call runs f, f's
// result, even nil, is not recorded and Do's error matches
// [ErrLeaseLost]. The error of a call, rare, whose run lease was lost
// before f could start (f is then not called) matches [ErrLeaseLost] too.
//
// If ctx ends while waiting, Do returns an error for which errors.Is(err,
// ctx.Err()) holds and leaves nothing behind, also when the server gave
// this call the run lease but the reply was lost (unless Redis stays
// unreachable for more than 5 s: see the package documentation). If ctx
// ends while f runs or after f returned, while the run is being ended (a
// server slow to answer), Do returns then, with f's error or, if f
// succeeded, ctx's error: the run ends in the background (a success marks
// the Once done), and a later call learns the outcome.
//
// The ctx passed to f is cancelled when ctx is done, when the run lease is
// lost (its cause, [context.Cause], is then [ErrLeaseLost]) and when the
// Client is closed (cause [ErrClosed]; the run lease is then not released
// and waiters take over after the TTL, as if the process had died).
//
// If f panics, the run lease is released, so that a waiting call runs f
// next, and the panic continues with the same value (from a deferred
// function of Do, so the stack trace starts there). Like sync.Once, calling
// Do on the same name from inside f waits for itself until ctx ends.
func (o *Once) Do(ctx context.Context, f func(ctx context.Context) error) error {
	if f == nil {
		if err := o.check(); err != nil {
			return err
		}
		return fmt.Errorf("%w: nil function", ErrInvalid)
	}
	_, err := o.DoValue(ctx, func(ctx context.Context) ([]byte, error) {
		return nil, f(ctx)
	})
	return err
}

// DoValue is [Once.Do] for a function with a result: the bytes f returns
// when it succeeds are stored with the done mark, and every call returns
// them — the one that ran f, those that waited, and those that come later
// (in one round trip) until the mark expires or is reset. The value lives in
// Redis, so keep it small; an empty value is returned as nil.
//
// A Once done by [Once.Do] has an empty value.
func (o *Once) DoValue(ctx context.Context, f func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if f == nil {
		return nil, fmt.Errorf("%w: nil function", ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The call's token names its run and, sent with every attempt, is also
	// the call's id: a repeat of an attempt changes nothing, and a late copy
	// of one after the call ended takes nothing.
	oc := &onceCall{o: o, tok: newToken()}
	// The run is never handed over: the end of a run only wakes the
	// waiters (the addressee is zero), and the one whose attempt reaches
	// Redis first takes the run. A waiter has no queue place to keep (ttl
	// zero): it sleeps until the runner's lease would run out.
	oc.acquisition = acquisition{ch: o.ch}
	// The lease is measured from the attempt that was granted the run, so
	// that a call that waited longer than the TTL gets a whole lease.
	g, start, err := o.take(ctx, oc)
	if err != nil {
		return nil, err
	}
	if g.kind == final {
		if g.err != nil {
			return nil, g.err
		}
		return oc.value, nil
	}
	tok := oc.tok
	return o.run(ctx, tok, start, f)
}

// take runs the acquisition of oc, counted as a call in progress until
// the run lease is taken (see inflight): Close waits for it, but not for f.
func (o *Once) take(ctx context.Context, oc *onceCall) (grant, time.Time, error) {
	if !o.c.begin() {
		return grant{}, time.Time{}, ErrClosed
	}
	defer o.c.end()
	g, start, err := o.c.take(ctx, &oc.acquisition, oc, true)
	if err == nil && g.kind != final && ctx.Err() != nil {
		// The lease came with the end of ctx: do not start f.
		o.c.cleanup(ctx, oc)
		return grant{}, start, ctx.Err()
	}
	return g, start, err
}

// A onceCall is one Do or DoValue call, as the engine drives it (see
// acquirer).
type onceCall struct {
	acquisition
	o      *Once
	tok    string
	value  []byte // the done mark's value, once an attempt found it
	waited bool   // an attempt of this call was refused
}

func (oc *onceCall) attempt(ctx context.Context, _ bool) (grant, error) {
	g, v, err := oc.o.attempt(ctx, oc.tok, oc.waited)
	if err == nil && g.kind == refused {
		oc.waited = true
	}
	oc.value = v
	return g, err
}

func (oc *onceCall) abandon(ctx context.Context) error { return oc.o.abandon(ctx, oc.tok) }

func (oc *onceCall) restart() { oc.tok, oc.waited = newToken(), false }

// Done reports whether the Once is done: a run succeeded and its mark has
// neither expired nor been reset. It changes nothing. It returns when ctx
// ends, as every call does, also while the server holds the command; a
// done mark that holds data dsync did not write is an error matching
// [ErrCorrupt] (a key of another type), or no mark (a hash without a
// value), as [Once.Do] takes it.
func (o *Once) Done(ctx context.Context) (bool, error) {
	if err := o.check(); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var cmd *redis.BoolCmd
	if !o.c.within(ctx, func() { cmd = o.c.rdb.HExists(ctx, o.keys[1], "v") }) {
		return false, ctx.Err()
	}
	done, err := cmd.Result()
	return done, scriptError(err)
}

// Reset removes the done mark, with its value, so that the next call of Do
// runs f again; it is for operators (a job to redo) and tests. A run in
// progress is not stopped: when it succeeds it marks the Once done again.
// Reset of a Once that is not done does nothing. A Reset whose reply was
// lost is sent again, as the same call, while ctx lasts; an error that is
// not a Redis reply means its outcome is unknown (the call is then noted
// as given up in the background, unless it was applied, so that a copy of
// it still on its way removes nothing). A copy of the Reset,
// sent again by go-redis after a read timeout or by Reset itself, arriving
// late, removes nothing (within the replay window; see README): not the
// done mark of a run that succeeded after the Reset took effect, also
// when it arrives after that window (each attempt carries a bound, as Do's
// do).
func (o *Once) Reset(ctx context.Context) error {
	if err := o.check(); err != nil {
		return err
	}
	if !o.c.begin() {
		return ErrClosed
	}
	defer o.c.end()
	// The script is idempotent for one id: an attempt whose reply was lost
	// is made again under the same id, after a pause that doubles, while
	// ctx lasts. A Reset of a new id could remove the done mark of a run
	// that succeeded after the first attempt took effect.
	id := newCallID()
	for wait := minRetry; ; wait = min(2*wait, time.Second/2) {
		// An attempt past its bound changed nothing (see clock.go).
		_, err := bounded(&o.c.clock, "once reset", func(bound any) (struct{}, int64, bool, error) {
			v, err := o.c.eval(ctx, onceReset, o.kargs, id, bound).Result()
			ms, stale := staleReply(v)
			return struct{}{}, ms, err == nil && stale, err
		})
		if err == nil || !unknownOutcome(err) || errors.Is(err, errStaleAttempts) || ctx.Err() != nil {
			if err != nil && unknownOutcome(err) {
				o.c.cleanup(ctx, resetAbandon{o, id})
			}
			return scriptError(err)
		}
		t := getTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
		case <-o.c.closed:
			putTimer(t)
			o.c.cleanup(ctx, resetAbandon{o, id})
			return err
		}
		putTimer(t)
	}
}

// A resetAbandon is the undo of a Reset, call id, whose caller was not
// told its outcome (no attempt got a reply, or each reached the server
// after its bound): it notes the id as given up unless an attempt of it
// was applied, so that a copy of an attempt still on its way removes no
// done mark set after the caller was told. (One already applied cannot be
// undone: that outcome stays unknown to the caller.)
type resetAbandon struct {
	o  *Once
	id string
}

func (r resetAbandon) abandon(ctx context.Context) error {
	o := r.o
	return o.c.eval(ctx, onceReset, o.kargs, r.id, argNone, argYes).Err()
}

// attempt runs the do script once; waited says that an earlier attempt of
// the call was refused. A done Once is a final grant, with the done mark's
// value.
func (o *Once) attempt(ctx context.Context, tok string, waited bool) (grant, []byte, error) {
	w := argNo
	if waited {
		w = argYes
	}
	sent := time.Now()
	// Each attempt carries its bound (see clock.go); one that arrived
	// after it is sent again, once the estimate of the server's clock is
	// corrected.
	r, err := bounded(&o.c.clock, "once do", func(bound any) ([]any, int64, bool, error) {
		r, err := o.c.eval(ctx, onceDo, o.kargs, tok, o.ttlArg, w, bound).Slice()
		if err != nil {
			return nil, 0, false, scriptError(err)
		}
		if len(r) != 2 {
			return nil, 0, false, replyError("once do", r)
		}
		ms, stale := staleReply(r)
		return r, ms, stale, nil
	})
	if err != nil {
		return grant{}, nil, err
	}
	code, _ := r[0].(int64)
	switch code {
	case 4:
		s, ok := r[1].(string)
		if !ok {
			return grant{}, nil, replyError("once do", r)
		}
		if !waited && time.Since(sent) >= o.c.resentAfter {
			// A first attempt that finds the Once done is remembered by
			// nothing (so that a Do on a done Once writes nothing). This
			// one took long enough for go-redis to have sent it again: a
			// late first copy, after a Reset or the end of the period,
			// would take a run that nobody renews or ends. Remember the
			// call as over, as an abandon does (in the background once
			// ctx ends: the call still returns in time).
			o.c.cleanup(ctx, doneCheck{o, tok})
		}
		if s == "" {
			return grant{kind: final}, nil, nil
		}
		return grant{kind: final}, []byte(s), nil
	}
	v, ok := r[1].(int64)
	if !ok {
		return grant{}, nil, replyError("once do", r)
	}
	g, ok, err := decodeGrant(pairReply{code: code, v: v}, false, "Once "+strconv.Quote(o.name))
	if !ok {
		return grant{}, nil, replyError("once do", r)
	}
	return g, nil, err
}

// A doneCheck is a Do call that found the Once done, to be remembered as
// over (see attempt).
type doneCheck struct {
	o   *Once
	tok string
}

func (d doneCheck) abandon(ctx context.Context) error { return d.o.abandon(ctx, d.tok) }

// abandon undoes whatever a failed call may have done on the server: a run
// lease it was given whose reply was lost. It runs detached from ctx, which
// may be done.
func (o *Once) abandon(ctx context.Context, tok string) error {
	_, _, err := o.release(ctx, tok, "abandon", nil)
	return err
}

// release runs the release script detached from ctx: 1 released, 0 the call
// did not hold the run lease, 4 (for "done") it did not and the Once is
// done by another call, whose value is returned.
func (o *Once) release(ctx context.Context, tok, mode string, value []byte) (int64, []byte, error) {
	dctx, cancel := detached(ctx)
	defer cancel()
	var period int64
	if o.cfg.period > 0 {
		period = ms(o.cfg.period)
	}
	// The script is idempotent, so an attempt whose reply was lost is
	// simply made again, after a pause that doubles (as base.retryRelease
	// does), until a reply comes or dctx ends (releaseTimeout).
	for wait := minRetry; ; wait = min(2*wait, time.Second/2) {
		var r any
		var err error
		if mode == releaseDone {
			// A 'done' carries a bound: a copy of it past the bound never
			// marks the Once done (see once_release.lua).
			r, err = bounded(&o.c.clock, "once release", func(bound any) (any, int64, bool, error) {
				r, err := o.c.eval(dctx, onceRelease, o.kargs, tok, mode, value, period, o.ch, bound).Result()
				ms, stale := staleReply(r)
				return r, ms, err == nil && stale, err
			})
		} else {
			r, err = o.c.eval(dctx, onceRelease, o.kargs, tok, mode, value, period, o.ch).Result()
		}
		switch {
		case err == nil:
			return releaseReply(r)
		case !unknownOutcome(err) || dctx.Err() != nil:
			return 0, nil, err
		}
		t := getTimer(wait)
		select {
		case <-t.C:
		case <-dctx.Done():
		case <-o.c.closed:
			putTimer(t)
			return 0, nil, err
		}
		putTimer(t)
	}
}

// releaseDone is the mode of a release whose f succeeded (see
// once_release.lua).
const releaseDone = "done"

// releaseReply decodes the reply r of the release script (see release).
func releaseReply(r any) (int64, []byte, error) {
	switch r := r.(type) {
	case int64:
		return r, nil, nil
	case []any:
		if len(r) == 2 {
			code, _ := r[0].(int64)
			if v, ok := r[1].(string); ok && code == 4 {
				if v == "" {
					return 4, nil, nil
				}
				return 4, []byte(v), nil
			}
		}
	}
	return 0, nil, replyError("once release", r)
}

// run calls f while the Client renews the run lease, and ends the run.
func (o *Once) run(ctx context.Context, tok string, start time.Time, f func(context.Context) ([]byte, error)) (val []byte, err error) {
	h := o.c.startHold(&o.cfg, renew.Spec{
		Batch: onceRenew,
		Keys:  o.keys[:1],
		Args:  []any{tok, o.ttlArg},
	}, holdID{tok: tok}, start)

	if o.cfg.replicas > 0 {
		// With WaitReplicas, make sure the run lease reached the replicas
		// before f starts.
		if err := o.c.replicated(ctx, &o.cfg, onceRenew, o.keys[:1], tok, o.ttlArg); err != nil {
			o.fail(ctx, tok, h, err)
			return nil, err
		}
	}

	if hl, ok := h.lease.(*renew.Hold); ok && !time.Now().Before(hl.Deadline()) {
		// The grant came back after the run lease's conservative deadline
		// (a stall longer than the TTL): another call may run f by now,
		// and the renewer has not told the lease yet. f is not called.
		h.lease.MarkLost()
		err := fmt.Errorf("%w: the run lease ran out before f could start", ErrLeaseLost)
		o.fail(ctx, tok, h, err)
		return nil, err
	}

	// f's ctx ends with ctx or with the lease.
	fctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-h.lease.Done():
			if err := h.lease.Err(); err != nil {
				cancel(err)
			} else {
				cancel(ErrClosed) // released only after f returned
			}
		case <-fctx.Done():
		}
	}()
	stop := func() {
		cancel(nil)
		wg.Wait()
	}

	returned := false
	defer func() {
		if returned {
			return
		}
		// f panicked (or called runtime.Goexit): free the run for the next
		// call, then let the panic go on.
		p := recover()
		stop()
		o.fail(ctx, tok, h, errPanicked)
		if p != nil {
			panic(p)
		}
	}()
	val, err = f(fctx)
	returned = true
	stop()

	if o.closed() {
		// As if the process had died: the lease runs out at its TTL.
		h.release()
		return nil, errors.Join(ErrClosed, err)
	}
	fin := onceFinish{o: o, tok: tok, h: h, val: val, ferr: err, out: new([]byte)}
	if serr := settle(&o.c.base, ctx, fin, onceSettler); serr != nil || err != nil {
		if err != nil && errors.Is(serr, ctx.Err()) && ctx.Err() != nil && !errors.Is(serr, err) {
			// ctx ended while the failed run was being ended: f's error
			// is the call's (the run ends in the background).
			return nil, err
		}
		return nil, serr
	}
	return *fin.out, nil
}

// errPanicked is the error of a run whose f panicked, as the run's end
// sees it.
var errPanicked = errors.New("dsync: f panicked")

// fail ends the run tok, held as h, that failed with err before f
// returned (f panicked, the run lease did not reach the replicas, or it
// ran out before f could start): it
// frees the run for the next call, in the background once ctx ends, as
// an Unlock does (see settle). After Close the run lease is left to
// expire, as if the process had died.
func (o *Once) fail(ctx context.Context, tok string, h *hold, err error) {
	if o.closed() {
		h.release()
		return
	}
	_ = settle(&o.c.base, ctx, onceFinish{o: o, tok: tok, h: h, ferr: err, out: new([]byte)}, onceSettler)
}

// onceFinish is what ends a run of f that returned (val, ferr): the call's
// run lease tok, held as h; out receives the value to return.
type onceFinish struct {
	o    *Once
	tok  string
	h    *hold
	val  []byte
	ferr error
	out  *[]byte
}

var onceSettler = &settler[onceFinish]{f: finishOnce}

// finishOnce ends a run of f, on a ctx from settle: it marks the Once done
// (or the run failed) and returns Do's result, its value in a.out. If ctx
// ends first, Do returns ctx's error (or f's) and the run ends in the
// background: a done mark not yet confirmed is no success to report.
func finishOnce(ctx context.Context, a onceFinish) error {
	o, tok, h, val, err := a.o, a.tok, a.h, a.val, a.ferr
	h.beginRelease()
	defer h.endRelease()
	if err != nil {
		r, _, rerr := o.release(ctx, tok, "fail", nil)
		// The lease is lost if the renewer found so, or if the release
		// found the run not this call's. (A repeat of a release whose
		// reply was lost answers as the first copy did.)
		lost := h.lost() || (rerr == nil && r == 0)
		if lost {
			h.lease.MarkLost()
		} else {
			h.release()
		}
		if lost {
			return fmt.Errorf("%w: %w", ErrLeaseLost, err)
		}
		if rerr != nil {
			// The lease expires at its TTL.
			return errors.Join(err, rerr)
		}
		return err
	}
	r, won, rerr := o.release(ctx, tok, releaseDone, val)
	if rerr != nil {
		// Still unknown after every try: the done mark may be set, or the
		// lease runs out at its TTL and another call runs f.
		h.release()
		return rerr
	}
	if r == 0 {
		h.lease.MarkLost()
		return fmt.Errorf("%w: another call took over the run", ErrLeaseLost)
	}
	if r == 4 {
		// The run lease was lost, and another call has made the Once
		// done since: its value is every caller's.
		h.lease.MarkLost()
		*a.out = won
		return nil
	}
	h.release()
	if len(val) > 0 {
		*a.out = val
	}
	return nil
}

func (o *Once) closed() bool {
	select {
	case <-o.c.closed:
		return true
	default:
		return false
	}
}
