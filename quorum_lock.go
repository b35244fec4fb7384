package dsync

import (
	"context"
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
func (ql *quorumLock[S]) lock(ctx context.Context, k *quorumCall, c lockCall, wait bool, fence func(a answers) uint64, spec member[S],
	cur func() *hold, held func(fence uint64, newHold func() *hold) (*hold, error)) (bool, error) {
	k.channel = ql.ch
	// Recorded before the call returns, so that errRegrant undoes it.
	k.accept = func(a answers, start time.Time) error {
		f := fence(a)
		if h := cur(); h != nil && reentered(h, a) {
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
		if err == nil && !made {
			if l, ok := h.lease.(*quorumLease); ok {
				l.reenter(a, sub)
			}
		}
		return err
	}
	a, _, err := ql.q.lock(ctx, k, wait)
	if err != nil || a.v == nil {
		return false, err
	}
	return true, nil
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
// hold it granted, where known (see memberHold): a late copy of the unlock
// can never end a later hold of the holder there.
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
	a := each(ql.subs, func(i int, sub S) (int64, error) {
		if send != nil && !send[i] {
			return 2, nil // keeps the levels left here
		}
		return unlock(ctx, sub, floor, memberHold(h, i).fenceArg())
	})
	if send != nil {
		for i, err := range a.err {
			if send[i] && err != nil {
				// The outcome is unknown there: a retry (same id) tells.
				return 0, err
			}
		}
		l.unlocked(send, a.v)
	}
	return a.unlocked(ql.q.need)
}
