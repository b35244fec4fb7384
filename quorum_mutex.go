package dsync

import (
	"context"

	"github.com/dsync-go/dsync/renew"
)

// Mutex returns a handle on the Mutex called name over q's masters.
// Options override the Quorum's defaults for this handle. An empty name, a
// bad option or [WaitReplicas] makes every call on the handle fail with
// [ErrInvalid].
func (q *Quorum) Mutex(name string, opts ...Option) *Mutex {
	m, k := newMutex(q.shared(), name, opts)
	m.err = handleErr(&m.cfg, m.err)
	m.impl = &quorumMutex{newQuorumLock(q, k.Channel(), func(c *Client) *mutexScripts {
		return quorumMember(newMutexScripts(c, &m.cfg, k, name))
	})}
	return m
}

// quorumMember returns s for a member of a quorum lock: its re-entries
// extend the hold on its master as without FixedLease or MaxHold. A
// re-entry that leaves a hold's expiry as it was tells how long the hold
// has left, which a quorum lease does not read: a Client of the same
// owner that re-enters a hold taken by another would then start a lease
// that outlives the hold on the masters.
func quorumMember(s *mutexScripts) *mutexScripts {
	s.lockArg = s.localArg
	return s
}

// quorumMemberRW is quorumMember for an RWMutex.
func quorumMemberRW(s *rwScripts) *rwScripts {
	s.lockArg = s.localArg
	return s
}

// quorumMutex is a Mutex over a quorum of masters.
type quorumMutex struct{ quorumLock[*mutexScripts] }

func (qm *quorumMutex) lock(ctx context.Context, m *Mutex, c lockCall, wait bool) (bool, error) {
	tok := c.tok
	return qm.quorumLock.lock(ctx, &quorumCall{
		ttl: m.cfg.ttl,
		try: func(ctx context.Context, i int, id string) (int64, error) {
			// No hand-overs: a quorum waiter takes no queue place (each
			// master would order its queue by the arrivals it saw and
			// hand the lock to different waiters, splitting the grants).
			g, err := qm.subs[i].attemptUnqueued(ctx, tok, id, wait)
			return vote(g, err, int64(g.fence))
		},
		undo: func(ctx context.Context, i int, id string) error { return qm.subs[i].abandon(ctx, tok, id) },
	}, c, wait, m.key, true, func(a answers) uint64 { return uint64(a.max) }, mutexMember, func() *hold {
		if !c.owned {
			return nil
		}
		return m.b.lookupHold(holdKey{m.key, c.otok})
	}, func(f uint64, newHold func() *hold) (*hold, error) {
		return m.held(c, f, newHold)
	})
}

func mutexMember(s *mutexScripts, tok any, f uint64) (*Client, *config, renew.Spec) {
	return s.c, s.cfg, s.renewSpec(tok, f)
}

func (qm *quorumMutex) unlock(ctx context.Context, tok, id string, h *hold) (int64, error) {
	return qm.quorumLock.unlock(ctx, h, func(ctx context.Context, s *mutexScripts, floor, fence any) (int64, error) {
		return s.unlockFloor(ctx, tok, id, floor, fence)
	})
}
