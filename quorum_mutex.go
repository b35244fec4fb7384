package dsync

import (
	"context"
	"time"
)

// Mutex returns a handle on the Mutex called name over q's masters.
// Options override the Quorum's defaults for this handle. An empty name, a
// bad option or [WaitReplicas] makes every call on the handle fail with
// [ErrInvalid].
func (q *Quorum) Mutex(name string, opts ...Option) *Mutex {
	m, k := newMutex(q.shared(), name, opts)
	m.err = handleErr(&m.cfg, m.err)
	m.impl = &quorumMutex{q: q, ch: k.Channel(), subs: members(q, func(c *Client) *mutexScripts {
		return newMutexScripts(c, &m.cfg, k, name)
	})}
	return m
}

// quorumMutex is a Mutex over a quorum of masters: the scripts of one
// deployment on each, granted by a majority.
type quorumMutex struct {
	q    *Quorum
	ch   string          // the notification channel on every master
	subs []*mutexScripts // the Mutex on each master
}

func (qm *quorumMutex) lock(ctx context.Context, m *Mutex, c lockCall, wait bool) (bool, error) {
	tok := c.tok
	a, _, err := qm.q.lock(ctx, &quorumCall{
		channel: qm.ch,
		ttl:     m.cfg.ttl,
		try: func(i int, id string) (int64, error) {
			g, err := qm.subs[i].attempt(ctx, tok, id, "", false)
			return vote(g, err, int64(g.fence))
		},
		undo: func(ctx context.Context, i int, id string) { qm.subs[i].abandon(ctx, tok, id) },
		// Recorded before the call returns, so that errRegrant undoes it.
		accept: func(a answers, start time.Time) error {
			fence := uint64(a.max)
			return m.held(c, fence, func() *hold {
				return qm.q.hold(tok, fence, a, func(i int) *hold {
					sub := qm.subs[i]
					return sub.c.startHold(sub.cfg, sub.renewSpec(tok, uint64(a.v[i])), holdID{tok: tok, fence: uint64(a.v[i])}, start)
				})
			})
		},
	}, wait)
	if err != nil || a.v == nil {
		return false, err
	}
	return true, nil
}

// unlock runs the unlock script on every master and sums up their replies
// as one master's reply (see answers.unlocked). It raises every master's
// fencing counter to the hold's token (see floorArg).
func (qm *quorumMutex) unlock(ctx context.Context, tok, id string, h *hold) (int64, error) {
	floor := floorArg(h)
	a := each(qm.subs, func(_ int, sub *mutexScripts) (int64, error) {
		return sub.unlockFloor(ctx, tok, id, floor, argNone)
	})
	return a.unlocked(qm.q.need)
}
