package dsync

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"reflect"
	"time"
)

// The Redlock loop of one quorum lock call: attempts on every master in
// parallel (poll), granted when a majority granted within the validity
// time, undone otherwise, and waits between attempts (see Quorum.lock).

// redlockDrift is the clock drift allowance of Redlock's validity time,
// the same allowance renew uses for conservative deadlines.
func redlockDrift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// splitBackoff bounds the random part of the pause after an attempt that
// took some but too few masters, so that contenders that split the masters
// do not retry in lockstep.
const splitBackoff = 5 * time.Millisecond

// A memberUndo undoes on member i whatever the attempts of a quorum call
// under id did there (see quorumCall.undo), as a failed call's clean-up
// (see Client.cleanup); tried, if set, is closed once the first try is
// over, and done once the undo is over.
type memberUndo struct {
	k     *quorumCall
	i     int
	id    string
	tried chan struct{}
	done  chan struct{}
}

func (u memberUndo) abandon(ctx context.Context) error {
	if u.done != nil {
		defer close(u.done)
	}
	// An undo that failed on the way (a connection cut) is tried again,
	// as a single master's is (see abandonRetrying): otherwise the
	// member's hold, if any, stays renewed by nobody for its whole TTL.
	// One that could not reach the master at all is not: the master is
	// down (a hold there expires at its TTL), and dialing it again and
	// again would keep go-redis's pool from seeing it come back. A later
	// attempt of the call there waits for done.
	first := true
	abandonRetrying(ctx, abandonFunc(func(ctx context.Context) error {
		err := u.k.undo(ctx, u.i, u.id)
		if first {
			first = false
			if u.tried != nil {
				close(u.tried)
			}
		}
		if dialFailed(err) {
			return nil
		}
		return err
	}))
	return nil
}

// dialFailed reports whether err is a failure to connect: the command was
// not sent.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// abandonFunc is an abandoner made of its undo.
type abandonFunc func(ctx context.Context) error

func (f abandonFunc) abandon(ctx context.Context) error { return f(ctx) }

// stragglerWait is how long a quorum attempt whose outcome is decided
// waits at least for the replies of the other masters (see poll): long
// enough for a loaded machine, so that a hold is kept on every master that
// answers in time (a Lease is lost when fewer than a majority keep it),
// short against a lease.
const stragglerWait = 200 * time.Millisecond

// errBusy is the answer of a member that a call does not ask (see poll).
var errBusy = errors.New("dsync: master still busy with an earlier attempt")

// poll makes one attempt of a call on every member, in parallel, with try,
// and collects the replies as each does; a member whose busy channel is
// open (the undo of the call's earlier attempt there still runs) is not
// asked, and answers errBusy. As soon as the replies decide the outcome
// (need grants, or too many refusals for that), it waits for the others as
// long again as that took, stragglerWait at least, but never past half
// the validity of a lease of ttl begun at the attempt's start (a short
// TTL's grants would have run out by then), and then gives up on them, as
// Redlock does on a slow master: their attempts end (see Client.within)
// and count as lost replies, which the caller undoes.
func (q *Quorum) poll(ctx context.Context, ttl time.Duration, busy []chan struct{}, try func(ctx context.Context, i int) (int64, error)) answers {
	n := len(q.members)
	a := answers{v: make([]int64, n), err: make([]error, n)}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type reply struct {
		i   int
		v   int64
		err error
	}
	replies := make(chan reply, n)
	asked := 0
	for i := range n {
		if busy[i] != nil {
			select {
			case <-busy[i]:
				busy[i] = nil
			default:
				a.err[i] = errBusy
				continue
			}
		}
		asked++
		go func() {
			v, err := try(pctx, i)
			replies <- reply{i, v, err}
		}()
	}
	start := time.Now()
	var late <-chan time.Time
	grants, refusals := 0, 0
	for range asked {
		var r reply
		select {
		case r = <-replies:
		case <-late:
			cancel()
			r = <-replies
		}
		a.v[r.i], a.err[r.i] = r.v, r.err
		switch {
		case r.err != nil:
		case r.v > 0:
			grants++
		default:
			refusals++
		}
		if late == nil && (grants >= q.need || refusals > n-q.need) {
			took := time.Since(start)
			t := time.NewTimer(max(0, min(max(took, stragglerWait), (ttl-redlockDrift(ttl))/2-took)))
			defer t.Stop()
			late = t.C
		}
	}
	a.tally()
	return a
}

// vote is what one member's reply to an attempt counts for in the Redlock
// loop (see quorumCall.try): v for a grant, minus the ms to wait at most
// for a refusal, 0 and the reason for a final refusal.
func vote(g grant, err error, v int64) (int64, error) {
	switch {
	case err != nil:
		return 0, err
	case g.kind == taken || g.kind == handed:
		return v, nil
	case g.kind == final:
		return 0, g.err
	case g.kind == over:
		return 0, errCallOver
	}
	return -max(g.wait.Milliseconds(), 1), nil
}

// errCallOver is the vote of a member where the call is over (see over): a
// hold was handed to it there and has ended. The call starts again there
// under a new id; the vote counts as a refusal.
var errCallOver = errors.New("dsync: call over on a master")

// A quorumCall is one lock call of a primitive in quorum mode, as the
// Redlock loop (Quorum.lock) sees it.
type quorumCall struct {
	channel string // the name's notification channel on every master
	ttl     time.Duration
	// try makes one attempt on member i under call id id: > 0 a grant,
	// < 0 minus the ms to wait at most, 0 as below.
	try func(ctx context.Context, i int, id string) (int64, error)
	// undo undoes on member i whatever the attempts under id did; ctx is
	// detached from the call's. An error says it may not have taken
	// effect (it is tried again).
	undo func(ctx context.Context, i int, id string) error
	// zero, if set, is what a reply of 0 from any member ends the call
	// with (RWMutex: ErrUpgrade); otherwise 0 is a refusal.
	zero error
	// keep: a member that refused a waiting call keeps the caller's
	// waiting place, and the call keeps its call id there, until the call
	// ends (RWMutex: a waiting writer holds back new readers, a waiting
	// reader is granted by a writer's Unlock).
	keep bool
	// accept, if set, records a grant; an error from it (errRegrant)
	// undoes the call on every member, and the call returns it.
	accept func(a answers, start time.Time) error
}

// lock runs the Redlock loop of one call: every attempt on all members in
// parallel, granted when a majority granted it within its validity, undone
// otherwise. On a grant it returns the replies and a time no later than the
// start of every granting member's lease.
func (q *Quorum) lock(ctx context.Context, k *quorumCall, wait bool) (answers, time.Time, error) {
	// Counted as a call in progress on every member (see inflight), whose
	// Close so waits for the undos this call starts there.
	for i, m := range q.members {
		if !m.begin() {
			for _, e := range q.members[:i] {
				e.end()
			}
			return answers{}, time.Time{}, ErrClosed
		}
	}
	defer func() {
		for _, m := range q.members {
			m.end()
		}
	}()
	n := len(q.members)
	ids := make([]string, n)      // each member's call id; "" once undone
	since := make([]time.Time, n) // no later than a grant under ids[i] began
	// The members whose last attempt got no reply, and those where its
	// undo still runs in the background (see poll).
	lost := make([]bool, n)
	busy := make([]chan struct{}, n)
	// undo undoes the attempts on the members which selects, in
	// parallel, each as a failed call's clean-up on its member: on a
	// member that answered, its first try waited for while ctx lasts, the
	// rest (tries again after a failure) left to the member Client's
	// background; on one that did not answer, a slow or paused master,
	// left to the background at once. A member is not asked again before
	// its undo is over. So the call returns in time also when a master is
	// slow, and an undo never overtakes a later attempt.
	undo := func(which func(i int) bool) {
		var us []memberUndo
		for i := range ids {
			if ids[i] != "" && which(i) {
				u := memberUndo{k: k, i: i, id: ids[i], done: make(chan struct{})}
				if !lost[i] {
					u.tried = make(chan struct{})
				}
				busy[i] = u.done
				us = append(us, u)
				ids[i] = ""
			}
		}
		each(us, func(_ int, u memberUndo) (int64, error) {
			uctx, cancel := context.WithCancel(ctx)
			defer cancel()
			if u.tried == nil {
				cancel()
			} else {
				go func() {
					select {
					case <-u.tried:
						cancel()
					case <-uctx.Done():
					}
				}()
			}
			q.members[u.i].cleanup(uctx, u)
			return 0, nil
		})
	}
	all := func(int) bool { return true }
	var ws []*watcher
	defer func() {
		for i, w := range ws {
			q.members[i].notify.unwatch(w)
		}
	}()
	var t *time.Timer
	// Attempts are minRetry apart at least, whatever the masters reply or
	// anyone publishes, but for the first one a notification asks for,
	// which is made at once (as the engine's waiters do).
	prompt := true
	for {
		// A fresh call id for the members whose last one was undone:
		// undoing an attempt marks its id abandoned on the master.
		id := newCallID()
		start := time.Now()
		for i := range ids {
			if ids[i] == "" {
				ids[i], since[i] = id, start
			}
		}
		a := q.poll(ctx, k.ttl, busy, func(ctx context.Context, i int) (int64, error) { return k.try(ctx, i, ids[i]) })
		over := false
		for i, err := range a.err {
			lost[i] = err != nil
			switch {
			case errors.Is(err, errBusy):
				ids[i], lost[i] = "", false // not sent: nothing to undo
			case errors.Is(err, errCallOver):
				// Its id takes nothing there any more: a new one next time.
				ids[i], lost[i] = "", false
				a.err[i], a.v[i], over = nil, -1, true
			}
		}
		if over {
			a.got, a.hits, a.max = 0, 0, 0
			a.tally()
		}
		first := start
		for i := range ids {
			if a.err[i] == nil && a.v[i] > 0 && since[i].Before(first) {
				first = since[i]
			}
			if a.err[i] == nil && a.v[i] < 0 {
				// A grant to the waiting place begins after this reply.
				since[i] = start
			}
		}
		if k.zero != nil {
			for i, v := range a.v {
				if a.err[i] == nil && v == 0 {
					undo(all)
					return answers{}, first, k.zero
				}
			}
		}
		validity := k.ttl - time.Since(first) - redlockDrift(k.ttl)
		if a.hits >= q.need && validity > 0 {
			// A member whose reply was lost may hold it, and one that
			// refused may keep a waiting place: undo there.
			undo(func(i int) bool { return a.err[i] != nil || (k.keep && a.v[i] <= 0) })
			if k.accept != nil {
				if err := k.accept(a, first); err != nil {
					undo(all)
					return answers{}, first, err
				}
			}
			return a, first, nil
		}
		more := wait && a.got >= q.need
		undo(func(i int) bool { return !more || !k.keep || a.err[i] != nil || a.v[i] > 0 })
		if a.got < q.need {
			if err := ctx.Err(); err != nil {
				return answers{}, first, err
			}
			return answers{}, first, a.noQuorum(q.need)
		}
		if !wait {
			return answers{}, first, nil
		}
		if ws == nil {
			// Watch every member's channel, then try again at once: a
			// release before the subscriptions may have been missed.
			for _, c := range q.members {
				ws = append(ws, c.notify.watch(k.channel))
			}
			for i, w := range ws {
				w.awaitReady(ctx, q.members[i].closed)
			}
			continue
		}
		// Sleep until a release on any master, or as long as the holds
		// that refused can last.
		d := k.ttl / 2
		for _, v := range a.v {
			if v < 0 {
				d = min(d, time.Duration(-v)*time.Millisecond)
			}
		}
		if a.hits > 0 {
			d = min(d, minRetry+time.Duration(rand.Int64N(int64(splitBackoff))))
		}
		d = max(d, minRetry)
		if t == nil {
			t = time.NewTimer(d)
			defer t.Stop()
		} else {
			t.Reset(d)
		}
		woken, err := sleep(ctx, q.closed, ws, t)
		if err == nil && woken && !prompt {
			if r := minRetry - time.Since(start); r > 0 {
				t.Reset(r)
				_, err = sleep(ctx, q.closed, nil, t)
			}
		}
		if err != nil {
			undo(all) // the waiting places kept
			return answers{}, first, err
		}
		prompt = prompt && !woken
	}
}

// sleep waits for the timer, a notification on any member (woken), ctx or
// Close.
func sleep(ctx context.Context, closed chan struct{}, ws []*watcher, t *time.Timer) (woken bool, err error) {
	cases := make([]reflect.SelectCase, 0, len(ws)+3)
	cases = append(cases,
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(closed)},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(t.C)})
	for _, w := range ws {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.sig)})
	}
	switch i, _, _ := reflect.Select(cases); i {
	case 0:
		return false, ctx.Err()
	case 1:
		return false, ErrClosed
	case 2:
		return false, nil
	}
	return true, nil
}
