package dsync

import (
	"context"
	"errors"
	"time"
)

// RWMutex returns a handle on the RWMutex called name over q's masters.
// Options override the Quorum's defaults for this handle. An empty name, a
// bad option or [WaitReplicas] makes every call on the handle fail with
// [ErrInvalid]. An RWMutex and a [Mutex] of the same name are distinct
// locks.
func (q *Quorum) RWMutex(name string, opts ...Option) *RWMutex {
	rw, k := newRWMutex(q.shared(), name, opts)
	rw.err = handleErr(&rw.cfg, rw.err)
	rw.impl = &quorumRWMutex{q: q, ch: k.Channel(), subs: members(q, func(c *Client) *rwScripts {
		return newRWScripts(c, &rw.cfg, k, name)
	})}
	return rw
}

// quorumRWMutex is an RWMutex over a quorum of masters: the scripts of one
// deployment on each, granted by a majority.
type quorumRWMutex struct {
	q    *Quorum
	ch   string       // the notification channel on every master
	subs []*rwScripts // the RWMutex on each master
}

// lock takes a hold in mode. A read is granted when a majority of masters
// granted it, each with its own writer preference; a waiting caller keeps
// its waiting place on the masters that refused it between attempts, so a
// waiting writer holds back new readers there and a writer's Unlock there
// grants a waiting reader (whose next attempt finds the grant). An upgrade
// refused by any master undoes the call everywhere.
func (qr *quorumRWMutex) lock(ctx context.Context, rw *RWMutex, mode string, c lockCall, wait bool) (bool, error) {
	tok := c.tok
	a, _, err := qr.q.lock(ctx, &quorumCall{
		channel: qr.ch,
		ttl:     rw.cfg.ttl,
		try: func(i int, id string) (int64, error) {
			// Never starving: quorum writers do not queue. Each master
			// would order its queue by the arrivals it saw and hand the
			// lock to different writers, splitting the grants.
			g, err := qr.subs[i].attempt(ctx, mode, tok, id, "-", wait, false)
			if err == nil && g.kind == final && errors.Is(g.err, ErrUpgrade) {
				return 0, nil // see quorumCall.zero
			}
			// The fencing token, or a read hold's id.
			return vote(g, err, int64(g.fence))
		},
		undo: func(ctx context.Context, i int, id string) { qr.subs[i].abandon(ctx, mode, tok, id) },
		zero: ErrUpgrade,
		keep: true,
		// Recorded before the call returns, so that errRegrant undoes it.
		accept: func(a answers, start time.Time) error {
			fence := uint64(a.max)
			if mode == modeRead {
				fence = 0
			}
			return rw.held(mode, c, fence, func() *hold {
				return qr.q.hold(tok, fence, a, func(i int) *hold {
					sub := qr.subs[i]
					// This master's fencing token, or its id of the read hold.
					return sub.c.startHold(sub.cfg, sub.renewSpec(mode, tok, uint64(a.v[i])), holdID{tok: tok, fence: uint64(a.v[i])}, start)
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
// as one master's reply (see answers.unlocked). An Unlock raises every
// master's fencing counter to the write hold's token, as for Mutex, and
// names on each master the hold that master granted, where known.
func (qr *quorumRWMutex) unlock(ctx context.Context, mode, tok, id string, h *hold) (int64, error) {
	floor := floorArg(h)
	a := each(qr.subs, func(i int, sub *rwScripts) (int64, error) {
		return sub.unlockFloor(ctx, mode, tok, id, floor, memberHold(h, i).fenceArg())
	})
	return a.unlocked(qr.q.need)
}
