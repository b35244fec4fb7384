package dsync

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/dsync-go/dsync/renew"
)

// A quorumLock is what a Mutex and an RWMutex over a quorum of masters
// share (quorumMutex, quorumRWMutex): the scripts of one deployment on each
// master (S: mutexScripts or rwScripts), granted by a majority. The
// primitive supplies its attempt, its undo and the renewal of a member
// hold; the Redlock loop, the hold and its lease, and the unlock are here.
type quorumLock[S any] struct {
	q    *Quorum
	ch   string // the notification channel on every master
	subs []S    // the primitive on each master
}

// newQuorumLock returns the quorumLock of a handle over q's masters,
// notified on ch, whose scripts on a master's Client mk returns.
func newQuorumLock[S any](q *Quorum, ch string, mk func(c *Client) S) quorumLock[S] {
	return quorumLock[S]{q: q, ch: ch, subs: members(q, mk)}
}

// member returns the Client and configuration of the primitive's scripts
// on one master, and the renewal of holder tok's hold there with fencing
// token (or read hold id) f.
type member[S any] func(sub S, tok any, f uint64) (*Client, *config, renew.Spec)

// lock runs one lock call for holder c.tok (see quorumCall, whose channel
// and accept it sets) and reports whether it took the hold. On a grant the
// hold, with fencing token fence(a), is recorded with held, which starts it
// (newHold) unless it is a re-entry: one member hold per granting master,
// renewed as spec says. A re-entry counts a level on the masters that
// granted it (see quorumLease.levels).
//
// A grant that re-entered the owner's recorded hold (cur) on some master
// is a re-entry of it, whatever tokens the other masters gave: a master
// that had not granted the first call gives a fresh one.
//
// An owner's call is told, on each master, of the member holds there that
// an unlock of the owner naming no hold ended (see ownerFlight: each
// member Client notes them as for a call on its one deployment; key is
// the key the holds are recorded under, ordered says that a master's
// grants carry fencing tokens, not read hold ids). A master's grant of a
// member hold so ended, the unlock's reply there coming first, holds
// nothing: it does not count, and a call left without a majority of
// grants starts again, as on one deployment (errSuperseded), rather than
// return with a quorum hold that Redis does not have.
func (ql *quorumLock[S]) lock(ctx context.Context, k *quorumCall, c lockCall, wait bool, key string, ordered bool, fence func(a answers) uint64, spec member[S],
	cur func() *hold, held func(fence uint64, newHold func() *hold) (*hold, error)) (bool, error) {
	k.channel = ql.ch
	ended := func(int, uint64) bool { return false }
	if c.owned {
		fk := holdKey{key, c.tok}
		for _, mc := range ql.q.members {
			mc.ownerFlightBegin(fk)
			defer mc.ownerFlightEnd(fk)
		}
		ended = func(i int, f uint64) bool { return ql.q.members[i].grantEnded(fk, f, ordered) }
	}
	// Recorded before the call returns, so that errRegrant undoes it.
	k.accept = func(a answers, start time.Time) error {
		if a = a.without(ended); a.hits < ql.q.need {
			return errSuperseded
		}
		// A hold reported lost is not re-entered, even where a master
		// still counts it: the grant is a fresh hold, with the largest
		// token a master gave.
		f := fence(a)
		if h := cur(); h != nil && !h.lost() && reentered(h, a) {
			f = h.fence
		}
		sub := func(i int) *hold {
			fi := uint64(a.v[i]) // this master's token, or its id of a read hold
			mc, cfg, s := spec(ql.subs[i], c.tok, fi)
			return mc.startHold(cfg, s, holdID{tok: c.tok, fence: fi}, start)
		}
		made := false
		h, err := held(f, func() *hold {
			made = true
			return ql.q.hold(c.tok, f, a, sub)
		})
		if err != nil {
			return err
		}
		if !made {
			if l, ok := h.lease.(*quorumLease); ok {
				l.reenter(a, sub)
			}
		}
		// An unlock reply that came after the check above, and before the
		// hold was recorded, found no member hold to mark lost (see
		// Quorum.memberEnded): its member hold is lost now.
		for i := range ql.subs {
			if m := memberHold(h, i); m != nil && !m.lost() && ended(i, m.fence) {
				m.lease.MarkLost()
			}
		}
		return nil
	}
	for {
		a, _, err := ql.q.lock(ctx, k, wait)
		if err == errSuperseded {
			// Undone on every master: the call starts again.
			if err := ql.q.restartWait(ctx); err != nil {
				return false, err
			}
			continue
		}
		if err != nil || a.v == nil {
			return false, err
		}
		return true, nil
	}
}

// without returns a with the grants of the masters for which drop reports
// true (given a master and its grant's token or read hold id) counted as
// refusals (a itself if there are none).
func (a answers) without(drop func(i int, v uint64) bool) answers {
	var d answers
	for i, v := range a.v {
		if a.err[i] != nil || v <= 0 || !drop(i, uint64(v)) {
			continue
		}
		if d.v == nil {
			d = answers{v: slices.Clone(a.v), err: a.err}
		}
		d.v[i] = -1
	}
	if d.v == nil {
		return a
	}
	d.tally()
	return d
}

// reentered reports whether grant a re-entered quorum hold h on some
// master: that master answered with the token (or read hold id) of h's
// member hold there.
func reentered(h *hold, a answers) bool {
	for i, v := range a.v {
		if m := memberHold(h, i); a.err[i] == nil && v > 0 && m != nil && m.fence == uint64(v) {
			return true
		}
	}
	return false
}

// unlock runs unlock on every master and sums up their replies as one
// master's reply (see answers.unlocked). Each master is told the hold's
// token as a floor for its fencing counter (see floorArg) and the member
// hold it granted (see memberFence): a late copy of the unlock can never
// end a later hold of the holder there.
//
// An owner's re-entries may have been granted by different majorities, so
// the masters may count different levels of its hold (see
// quorumLease.levels): an unlock that leaves levels ends one only on the
// masters that count more than are left, so that a majority keeps
// counting the hold until its last unlock.
func (ql *quorumLock[S]) unlock(ctx context.Context, h *hold, unlock func(ctx context.Context, sub S, floor, fence any) (int64, error)) (int64, error) {
	floor := floorArg(h)
	var l *quorumLease
	if h != nil {
		l, _ = h.lease.(*quorumLease)
	}
	send := l.unlockOn(ql.q.levels(h), len(ql.subs))
	var late func(i int, v int64, err error)
	if send != nil {
		// A master that answers after the call returned has its count of
		// levels here lowered then.
		late = func(i int, v int64, err error) { l.unlockedOn(send, i, v, err) }
	}
	// A master that did not count in the hold's grant is sent the unlock
	// too (it raises the fencing counter there), but its answer decides
	// nothing: it holds no level of the hold, and waiting for it (or
	// counting its "not held") would leave a master that did grant the
	// hold, slower to answer, cut off as a straggler, and the unlock read
	// as not held.
	// (Where fewer than a majority still have a member hold of it, every
	// master decides, as before there was such a distinction.)
	decides, granted := make([]bool, len(ql.subs)), 0
	for i := range decides {
		if decides[i] = memberFence(h, i) != any(noMemberArg); decides[i] {
			granted++
		}
	}
	if granted < ql.q.need {
		for i := range decides {
			decides[i] = true
		}
	}
	a := ql.q.gather(ctx, decides, func(ctx context.Context, i int) (int64, error) {
		if send != nil && !send[i] {
			return 2, nil // keeps the levels left here
		}
		return unlock(ctx, ql.subs[i], floor, memberFence(h, i))
	}, late)
	if send != nil {
		for i := range send {
			l.unlockedOn(send, i, a.v[i], a.err[i])
		}
	}
	return a.unlocked(ql.q.need)
}

// unlockStragglerWait is how long an unlock waits at least, once a
// majority answered, for the other masters (see gather): their unlocks go
// on in the background all the same, so it only saves the next unlock of
// a re-entered hold from asking a master again before its answer is in.
const unlockStragglerWait = 50 * time.Millisecond

// gather runs f on every member in parallel, as an unlock does, and
// collects the replies: once a majority answered (or too many failed for
// one to), it waits for the others as long again as that took,
// unlockStragglerWait at least, and returns. A member that has not
// answered by then counts as failed (errStraggler); its f goes on in the
// background under ctx, owned by the Quorum (Close waits for it a while),
// so that a slow master still gets its unlock without holding the call
// back, and its reply then goes to late (if not nil). Only the members
// for which decides is true count, for the majority and as stragglers:
// the others' f runs all the same, and their answers are errNotCounted.
func (q *Quorum) gather(ctx context.Context, decides []bool, f func(ctx context.Context, i int) (int64, error), late func(i int, v int64, err error)) answers {
	n := len(q.members)
	want := 0 // the members whose answers count
	for i := range n {
		if decides[i] {
			want++
		}
	}
	type reply struct {
		i   int
		v   int64
		err error
	}
	replies := make(chan reply, n) // never blocks
	var mu sync.Mutex
	returned := false
	for i := range n {
		owned := q.releases.add()
		go func() {
			if owned {
				defer q.releases.end()
			}
			v, err := f(ctx, i)
			mu.Lock()
			defer mu.Unlock()
			if !returned {
				replies <- reply{i, v, err}
			} else if late != nil {
				late(i, v, err)
			}
		}()
	}
	a := answers{v: make([]int64, n), err: make([]error, n)}
	for i := range a.err {
		a.err[i] = errStraggler
		if !decides[i] {
			a.err[i] = errNotCounted
		}
	}
	take := func(r reply) {
		if !decides[r.i] {
			return
		}
		if r.err != nil {
			r.v = 0
		}
		a.v[r.i], a.err[r.i] = r.v, r.err
	}
	start := time.Now()
	var cut <-chan time.Time
	answered, failed := 0, 0
	for answered+failed < want {
		var r reply
		select {
		case r = <-replies:
		case <-cut:
			mu.Lock()
			returned = true
			mu.Unlock()
			for more := true; more; {
				select {
				case r := <-replies:
					take(r)
				default:
					more = false
				}
			}
			a.tally()
			return a
		}
		if !decides[r.i] {
			continue
		}
		take(r)
		if r.err != nil {
			failed++
		} else {
			answered++
		}
		if cut == nil && (answered >= q.need || failed > want-q.need) {
			t := time.NewTimer(max(time.Since(start), unlockStragglerWait))
			defer t.Stop()
			cut = t.C
		}
	}
	a.tally()
	return a
}

var errStraggler = errors.New("dsync: master did not answer in time")

// errNotCounted is the answer, in gather, of a master whose answer does
// not decide (see quorumLock.unlock).
var errNotCounted = errors.New("dsync: master not counted in the hold")
