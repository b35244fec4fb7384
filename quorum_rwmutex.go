package dsync

import (
	"context"
	"errors"

	"github.com/dsync-go/dsync/renew"
)

// RWMutex returns a handle on the RWMutex called name over q's masters.
// Options override the Quorum's defaults for this handle. An empty name, a
// bad option or [WaitReplicas] makes every call on the handle fail with
// [ErrInvalid]. An RWMutex and a [Mutex] of the same name are distinct
// locks.
func (q *Quorum) RWMutex(name string, opts ...Option) *RWMutex {
	rw, k := newRWMutex(q.shared(), name, opts)
	rw.err = handleErr(&rw.cfg, rw.err)
	rw.impl = &quorumRWMutex{newQuorumLock(q, k.Channel(), func(c *Client) *rwScripts {
		return quorumMemberRW(newRWScripts(c, &rw.cfg, k, name))
	})}
	return rw
}

// quorumRWMutex is an RWMutex over a quorum of masters.
type quorumRWMutex struct{ quorumLock[*rwScripts] }

// lock takes a hold in mode. A read is granted when a majority of masters
// granted it, each with its own writer preference; a waiting caller keeps
// its waiting place on the masters that refused it between attempts, so a
// waiting writer holds back new readers there and a writer's Unlock there
// grants a waiting reader (whose next attempt finds the grant). An upgrade
// refused by any master undoes the call everywhere.
func (qr *quorumRWMutex) lock(ctx context.Context, rw *RWMutex, mode string, c lockCall, wait bool) (bool, error) {
	tok := c.tok
	fence := func(a answers) uint64 { return uint64(a.max) }
	if mode == modeRead {
		fence = func(answers) uint64 { return 0 }
	}
	return qr.quorumLock.lock(ctx, &quorumCall{
		ttl: rw.cfg.ttl,
		try: func(ctx context.Context, i int, id string) (int64, error) {
			// Never starving: quorum writers do not queue, as Mutex
			// waiters do not (quorumMutex.lock).
			g, err := qr.subs[i].attempt(ctx, mode, tok, id, "-", wait, false)
			if err == nil && g.kind == final && errors.Is(g.err, ErrUpgrade) {
				return 0, nil // see quorumCall.zero
			}
			// The fencing token, or a read hold's id.
			return vote(g, err, int64(g.fence))
		},
		undo: func(ctx context.Context, i int, id string) error { return qr.subs[i].abandon(ctx, mode, tok, id) },
		zero: ErrUpgrade,
		keep: true,
	}, c, wait, rw.modeKey(mode), mode == modeWrite, fence, func(s *rwScripts, tok any, f uint64) (*Client, *config, renew.Spec) {
		return s.c, s.cfg, s.renewSpec(mode, tok, f)
	}, func() *hold {
		if !c.owned {
			return nil
		}
		return rw.b.lookupHold(rw.holdKey(mode, c.otok))
	}, func(f uint64, newHold func() *hold) (*hold, error) {
		return rw.held(mode, c, f, newHold)
	})
}

func (qr *quorumRWMutex) unlock(ctx context.Context, mode, tok, id string, h *hold) (int64, error) {
	return qr.quorumLock.unlock(ctx, h, func(ctx context.Context, s *rwScripts, floor, fence any) (int64, error) {
		return s.unlockFloor(ctx, mode, tok, id, floor, fence)
	})
}
