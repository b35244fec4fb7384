package dsync

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The acquisition engine. Every primitive takes a hold the same way: an
// attempt (one script), and if refused, a wait for a notification or for
// the time the script said the current hold can last, then another
// attempt, until the hold is taken, handed over, or the call gives up; a
// call that gives up has whatever it may have done on the server undone in
// the background. A primitive supplies its attempt and abandon scripts
// through an acquirer, a struct per call, and decodes its replies into a
// grant; the engine does the rest.

// A grantKind says what one attempt achieved.
type grantKind int8

const (
	// refused: not held; wait (at most grant.wait) and try again.
	refused grantKind = iota
	// taken: this attempt took the hold or re-entered it.
	taken
	// handed: the hold was this call's before this attempt ran: handed
	// over to it while it waited, or taken by an earlier copy of the same
	// attempt (a go-redis retry after a lost reply).
	handed
	// final: not held, and waiting will not change that; grant.err says
	// why (nil for a try that found the name held).
	final
	// over: the call is over in Redis: a hold was handed over to it (or
	// taken by a copy of its attempt whose reply was lost) and has ended
	// before the call learned of it. Its id takes nothing any more; the
	// engine starts the call again under a new one (acquisition.restart).
	over
)

// A grant is a primitive's decoding of one attempt's reply.
type grant struct {
	kind  grantKind
	fence uint64 // taken, handed: the hold's fencing token
	// taken, handed: fence as the reply carried it, boxed by go-redis (or
	// boxed once here, for a hand-over learned from a notification), for
	// the renewals and unlocks that name the hold (see holdID).
	fenceArg any
	wait     time.Duration // refused: the longest the caller need wait
	// refused: the server's time (µs) when the attempt ran, 0 if the
	// reply did not say (see grantedBefore)
	at int64
	// taken, handed: how long the hold had left in Redis when the script
	// ran, when the call did not extend it to a whole TTL (a re-entry or
	// join under FixedLease or MaxHold); 0 if the reply did not say
	left time.Duration
	err  error // final
}

// minRetry bounds how often a waiter attempts, whatever Redis holds or
// anyone publishes: two of its attempts are at least minRetry apart, but
// for the first attempt a notification asks for, which is made at once.
const minRetry = 20 * time.Millisecond

// isClosed reports whether c was closed.
func (c *Client) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// cleanupGrace is how long a failed call waits for its clean-up before it
// returns and leaves the clean-up to the Client's background.
const cleanupGrace = 20 * time.Millisecond

// An acquisition is one call that takes a hold (Lock, RLock, Acquire,
// Once's run), as the engine sees it; the primitive's call embeds it and
// is the acquirer the engine drives, one struct per call rather than a
// closure per step. ttl is how long the queue place of a refused attempt
// lasts (the lease TTL): a waiter comes back within half of it to keep the
// place. It is zero when refused attempts take no place: a waiter then
// sleeps as long as the refusal said, unless notified first.
type acquisition struct {
	ch  string // the primitive's notification channel
	to  addressee
	ttl time.Duration
	// timed: a hand-over names the hold by its fencing token, which is at
	// least the server's time in µs when it was granted (lib.lua's
	// fence_after); not an RWMutex read hold's id (see grantedBefore).
	timed bool
}

// An acquirer is a primitive's side of one acquisition.
type acquirer interface {
	// attempt runs the primitive's attempt once; with queue, a refused
	// call takes (or keeps) its place in the queue.
	attempt(ctx context.Context, queue bool) (grant, error)
	// restart gives the call a new id (and addressee) after a grant of
	// kind over: attempt and abandon use it from then on.
	restart()
	abandoner
}

// An abandoner undoes what a failed call may have done on the server.
type abandoner interface {
	// abandon runs the undo once; an error says it may not have taken
	// effect (see Client.cleanup, which tries again).
	abandon(ctx context.Context) error
}

// restartPause is how long a call whose hold ended before it learned of
// it waits before it starts again: a hold that ended so quickly is no
// reason to hurry, and no remote state makes a call restart faster.
const restartPause = minRetry

// take runs the acquisition a, whose primitive's side is op: one attempt,
// and with wait, more after notifications until the hold is taken or
// handed over, or ctx ends. It returns the last grant and the lease start:
// the send time of the earliest attempt that could have produced the hold
// (for a hand-over, the last attempt sent before it). On error, op.abandon
// runs, in the background if it takes long.
func (c *Client) take(ctx context.Context, a *acquisition, op acquirer, wait bool) (grant, time.Time, error) {
	for {
		g, sent, err := c.takeAs(ctx, a, op, wait)
		if err == nil && (g.kind == taken || g.kind == handed) && c.isClosed() {
			// Granted, but Close came first: nobody would renew or release
			// the hold. The call fails, as one in progress at Close does,
			// and leaves nothing behind.
			c.cleanup(ctx, op)
			return grant{}, sent, ErrClosed
		}
		if err == nil && g.left > 0 && g.left < a.ttl {
			// The hold had less than a TTL left (see grant.left): its
			// lease, if the call starts one, ends when Redis ends it, as
			// that of a hold taken a TTL before its deadline would.
			sent = sent.Add(g.left - a.ttl)
		}
		if err != nil || g.kind != over {
			return g, sent, err
		}
		// The hold this call was given ended before it learned of it: the
		// call starts again, as a new one.
		if err := c.restartCall(ctx, op); err != nil {
			return grant{}, sent, err
		}
	}
}

// restartCall starts op's call again as a new one (a new id), after a
// pause of restartPause, as take does after a grant of kind over; it
// returns ctx's error, or ErrClosed, if that comes first.
func (c *Client) restartCall(ctx context.Context, op acquirer) error {
	if err := c.restartWait(ctx); err != nil {
		return err
	}
	op.restart()
	return nil
}

// restartWait waits restartPause before a call starts again (see
// restartCall, quorumLock.lock); it returns ctx's error, or ErrClosed, if
// that comes first.
func (b *base) restartWait(ctx context.Context) error {
	t := getTimer(restartPause)
	defer putTimer(t)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-b.closed:
		return ErrClosed
	case <-t.C:
	}
	return nil
}

// takeAs is take under the call's current id.
func (c *Client) takeAs(ctx context.Context, a *acquisition, op acquirer, wait bool) (grant, time.Time, error) {
	var mk mark
	if wait {
		mk = c.notify.mark(a.ch)
	}
	sent := time.Now()
	g, err := op.attempt(ctx, wait)
	waited := false
	if err == nil && g.kind == refused && wait {
		waited = true
		g, sent, err = c.await(ctx, a, op, g, sent, mk)
	}
	if err != nil {
		c.cleanup(ctx, op)
		return grant{}, sent, err
	}
	if waited && g.kind == final && g.err != nil {
		// The call fails after waiting (foreign data, say): undo what its
		// refused attempts did, such as a queue place that would hold
		// others back until it lapsed. (A first attempt that fails so
		// changed nothing.)
		c.cleanup(ctx, op)
	}
	return g, sent, nil
}

// await waits after a refused attempt sent at last, which returned g,
// until the hold is this call's or ctx ends.
func (c *Client) await(ctx context.Context, a *acquisition, op acquirer, g grant, last time.Time, mk mark) (grant, time.Time, error) {
	// Unless the channel was subscribed before the first attempt and
	// delivered nothing for this call since, a release may have been
	// missed: try again once subscribed.
	w, retry := c.notify.watchSince(a.ch, a.to, mk)
	defer c.notify.unwatch(w)
	t := getTimer(sleepFor(g.wait, a.ttl))
	defer putTimer(t)
	w.awaitReady(ctx, c.closed)
	asked := false // the next attempt was asked for by a notification
	// A hand-over message may be stale: delayed past the end of the hold
	// it gave, which a later attempt found gone and was refused. The hold
	// was given after the first refusal and lasts a.ttl, so a refusal
	// that came back within a.ttl of the first attempt's sending cannot
	// have seen it gone: then the hand-over came after that refusal too.
	first, refusedLate := last, false
	prompt := true // the first attempt a notification asks for is made at once
	for {
		if retry {
			if asked && !prompt {
				// However many notifications arrive, a waiter attempts at
				// most every minRetry.
				if d := minRetry - time.Since(last); d > 0 {
					t.Reset(d)
					retry, asked = false, false
					goto sleep
				}
			}
			if asked {
				// A run or hold that ended quickly is taken without delay.
				prompt = false
			}
			now := time.Now()
			var err error
			g, err = op.attempt(ctx, true)
			if err != nil {
				return grant{}, now, err
			}
			switch g.kind {
			case taken, final, over:
				return g, now, nil
			case handed:
				// Handed over after the previous attempt ran.
				return g, last, nil
			}
			last = now
			if time.Since(first) >= a.ttl-a.ttl/100-2*time.Millisecond {
				refusedLate = true
			}
			t.Reset(sleepFor(g.wait, a.ttl))
			retry, asked = false, false
		}
	sleep:
		select {
		case <-ctx.Done():
			return grant{}, last, ctx.Err()
		case <-c.closed:
			return grant{}, last, ErrClosed
		case <-t.C:
			retry = true
		case <-w.sig:
			if f, ok := w.handover(); ok {
				if !refusedLate && !(a.timed && c.grantedBefore(f, last, g.at)) {
					// Handed over after the last attempt, which was
					// refused: the lease starts no later than the send
					// time of that attempt.
					return grant{kind: handed, fence: f, fenceArg: f}, last, nil
				}
				// Late, or granted before the last attempt was sent,
				// which was refused all the same: the server no longer
				// knew of the grant (the name's keys were deleted) and
				// queued the call afresh; taken as this call's, the hold
				// would be one Redis does not have, and the new queue
				// place would be handed the next release's hold, held by
				// nobody. Ask the script whether the hold is still this
				// call's: if so, it was handed over after the last
				// refusal, and the lease is measured from that attempt.
				// As for any notification, at most every minRetry:
				// whoever can read the queue data can prove a hand-over
				// that never was.
				retry, asked = true, true
				continue
			}
			// A plain release, a resubscription or a hand-over to another
			// call of the same holder invites a retry; a hand-over to
			// another waiter does not, and the timer keeps running.
			if w.shouldRetry() {
				retry, asked = true, true
			}
		}
	}
}

// grantedBefore reports whether a hand-over with fencing token f was
// granted before a refused attempt sent at t that ran at server time at
// (µs; 0 if its reply did not say): a fencing token is at least the
// server's time in µs when its script ran, and an attempt runs after it
// was sent. The server's time at t is this Client's estimate (see
// serverClock): a local clock ahead of the server's only makes a waiter
// ask the script about a hand-over it could have taken at once. The time
// the refusal ran covers an attempt delayed on its way, which ran after a
// hand-over granted after it was sent. (A fencing counter ahead of the
// server's clock, from foreign data or a clock stepped back, can make a
// grant before the refusal look later.)
func (c *Client) grantedBefore(f uint64, t time.Time, at int64) bool {
	return f < maxFence && (int64(f) < at || int64(f) < t.UnixMicro()+c.clock.off.Load()*1000)
}

// sleepFor is how long a waiter sleeps at most after a refused attempt
// that said to wait d: no longer than the hold (or queue place) can last,
// and, with a queue place that lasts ttl, so that the place is refreshed
// in time; never less than minRetry.
func sleepFor(d, ttl time.Duration) time.Duration {
	if ttl > 0 {
		d = min(d, ttl/2)
	}
	return max(d, minRetry)
}

// cleanup runs u.abandon, which undoes what a failed call may have done on
// the server, on a context of its own: the call's ctx may be done. While
// ctx lasts it waits for it (a call that failed on a lost reply returns
// with nothing left behind); once ctx is done, cleanupGrace more at most.
// The rest runs in the background, owned by c (Close stops it), so that a
// call returns in time also when Redis is slow or unreachable.
func (c *Client) cleanup(ctx context.Context, u abandoner) {
	done := make(chan struct{})
	run := func(owned bool) {
		defer close(done)
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if owned {
			stop := context.AfterFunc(c.bgCtx, cancel)
			defer stop()
		}
		abandonRetrying(dctx, u)
	}
	if !c.bg.start(func() { run(true) }) {
		// Closed (a call that Close ended, say): the clean-up runs all
		// the same, on its own, within its budget.
		go run(false)
	}
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	t := getTimer(cleanupGrace)
	defer putTimer(t)
	select {
	case <-done:
	case <-t.C:
	}
}

// abandonRetrying runs u's undo until it took effect or ctx ends (see
// Client.cleanup, whose budget ctx is): an undo is idempotent, and one that
// failed on the way (a connection cut, the server restarting) would leave
// what the call took held, and renewed by nobody, for its whole TTL. It
// pauses between tries from minRetry, doubling, up to a second; an error
// the server sent back (foreign data, say) is not tried again.
func abandonRetrying(ctx context.Context, u abandoner) {
	pause := minRetry
	for {
		err := u.abandon(ctx)
		if err == nil || ctx.Err() != nil || !transient(err) {
			return
		}
		t := getTimer(pause)
		select {
		case <-ctx.Done():
			putTimer(t)
			return
		case <-t.C:
		}
		putTimer(t)
		pause = min(2*pause, time.Second)
	}
}

// transient reports whether err, the error of a command, may not recur
// if the command is sent again: no reply came, or the server was not ready.
// A Redis client closed by its user sends nothing again.
func transient(err error) bool {
	if errors.Is(err, redis.ErrClosed) {
		return false
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return true
	}
	msg := re.Error()
	for _, p := range []string{"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// timers recycles the timers of waits (see getTimer): a contended call
// waits once or more, and a timer is two allocations.
var timers sync.Pool

// getTimer returns a timer, running for d, to give back with putTimer.
func getTimer(d time.Duration) *time.Timer {
	if t, ok := timers.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

// putTimer stops t and recycles it. Its channel is drained, so that the
// next user sees no stale tick also where timers' channels are buffered
// (GODEBUG asynctimerchan=1, the default before Go 1.23 for a main module
// that says so).
func putTimer(t *time.Timer) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	timers.Put(t)
}
