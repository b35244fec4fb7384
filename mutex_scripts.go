package dsync

import (
	"context"
	"strconv"

	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/renew"
)

// mutexScripts is a Mutex on one deployment: its scripts run on the
// Client's Redis, and its calls wait through the Client's engine. A
// quorumMutex runs one per master.
type mutexScripts struct {
	c    *Client
	cfg  *config
	keys []string // lock hash, fence hash, queue, queue data, call ids

	// Script arguments boxed once per handle.
	kargs    []any // key count and keys
	ttlArg   any
	chanArg  any
	localArg any    // '1' with client reentrancy
	what     string // how errors name the Mutex
}

func newMutexScripts(c *Client, cfg *config, k keys.Mutex, name string) *mutexScripts {
	s := &mutexScripts{c: c, cfg: cfg, keys: k.Keys(), chanArg: k.Channel(), localArg: argNo}
	s.kargs = boxKeys(s.keys)
	s.ttlArg = ms(cfg.ttl)
	s.what = "Mutex " + strconv.Quote(name)
	if cfg.local {
		s.localArg = argYes
	}
	return s
}

// lock takes the hold through the engine (see mutexImpl).
func (s *mutexScripts) lock(ctx context.Context, m *Mutex, c lockCall, wait bool) (bool, error) {
	tok, id := c.tok, newCallID()
	a := &acquisition{
		ch:  s.chanArg.(string),
		to:  newAddressee(tok, id),
		ttl: s.cfg.ttl,
	}
	a.attempt = func(ctx context.Context, queue bool) (grant, error) {
		return s.attempt(ctx, tok, id, a.to.secret, queue)
	}
	a.abandon = func(ctx context.Context) { s.abandon(ctx, tok, id) }
	a.restart = func() { id = newCallID(); a.to = newAddressee(tok, id) }
	g, start, err := s.c.take(ctx, a, wait)
	if err == nil && g.kind == handed && s.cfg.replicas > 0 {
		// With WaitReplicas, make sure the hand-over reached replicas.
		if err = s.c.replicated(ctx, s.cfg, mutexRenew, s.keys[:1], tok, s.ttlArg); err != nil {
			s.c.cleanup(ctx, a.abandon)
		}
	}
	if err == nil && g.kind == final {
		err = g.err
	}
	if err != nil || (g.kind != taken && g.kind != handed) {
		return false, err
	}
	if err := m.held(c, g.fence, func() *hold {
		return s.c.startHold(s.cfg, s.renewSpec(tok), tok, g.fence, start)
	}); err != nil {
		// errRegrant: the hold may be one a release in this process is
		// ending. Undo the call; the caller takes the hold again.
		s.c.cleanup(ctx, a.abandon)
		return false, err
	}
	return true, nil
}

// attempt runs the lock script once. With queue, a refused caller takes (or
// keeps) a place in the queue.
func (s *mutexScripts) attempt(ctx context.Context, tok, id, secret string, queue bool) (grant, error) {
	q := argNo
	if queue {
		q = argYes
	}
	r, err := s.c.acquirePair(ctx, s.cfg, mutexLock, s.kargs, tok, s.ttlArg, id, q, fenceIdleArg, s.localArg, secret)
	code, v, err := pair("mutex lock", r, err)
	if err != nil {
		return grant{}, err
	}
	g, ok, err := decodeGrant(code, v, true, s.what)
	if !ok {
		return grant{}, replyError("mutex lock", code)
	}
	return g, err
}

// abandon undoes whatever the lock call id of tok may have done.
func (s *mutexScripts) abandon(ctx context.Context, tok, id string) {
	_ = s.c.eval(ctx, mutexUnlock, s.kargs, tok, newCallID(), s.chanArg, fenceIdleArg, id, argNone, argNone, s.localArg).Err()
}

// unlock runs the unlock script, naming the hold h ends.
func (s *mutexScripts) unlock(ctx context.Context, tok, id string, h *hold) (int64, error) {
	return s.unlockFloor(ctx, tok, id, argNone, h.fenceArg())
}

// unlockFloor runs the unlock script for holder tok with call id; floor,
// if set, raises the fencing counter to it, and fence, if set, names the
// hold the unlock ends.
func (s *mutexScripts) unlockFloor(ctx context.Context, tok, id string, floor, fence any) (int64, error) {
	return s.c.eval(ctx, mutexUnlock, s.kargs, tok, id, s.chanArg, fenceIdleArg, argNone, floor, fence).Int64()
}

// renewSpec describes the renewal of tok's hold.
func (s *mutexScripts) renewSpec(tok string) renew.Spec {
	return renew.Spec{Batch: mutexRenew, Keys: s.keys[:1], Args: []any{tok, s.ttlArg}}
}
