package dsync

import (
	"context"
	"strconv"

	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/renew"
)

// rwScripts is an RWMutex on one deployment: its scripts run on the
// Client's Redis, and its calls wait through the Client's engine. A
// quorumRWMutex runs one per master.
type rwScripts struct {
	c   *Client
	cfg *config
	// writer hash, fence hash, readers zset, readers hash, waiting writers
	// zset, waiting readers hash, call ids zset, writers' queue zset,
	// queued writers hash
	keys  []string
	kargs []any  // keys boxed once (see boxKeys)
	ch    string // notification channel
	what  string // how errors name the RWMutex
}

func newRWScripts(c *Client, cfg *config, k keys.RWMutex, name string) *rwScripts {
	s := &rwScripts{c: c, cfg: cfg, keys: k.Keys(), ch: k.Channel(), what: "RWMutex " + strconv.Quote(name)}
	s.kargs = boxKeys(s.keys)
	return s
}

// lock takes the hold through the engine (see rwImpl).
func (s *rwScripts) lock(ctx context.Context, rw *RWMutex, mode string, c lockCall, wait bool) (bool, error) {
	tok, id := c.tok, newCallID()
	a := &acquisition{ch: s.ch, to: newAddressee(tok, id), ttl: s.cfg.ttl}
	a.attempt = func(ctx context.Context, queue bool) (grant, error) {
		// Writers queue from their first refused attempt, as Mutex
		// waiters do.
		return s.attempt(ctx, mode, tok, id, a.to.secret, queue, queue)
	}
	a.abandon = func(ctx context.Context) { s.abandon(ctx, mode, tok, id) }
	a.restart = func() { id = newCallID(); a.to = newAddressee(tok, id) }
	g, start, err := s.c.take(ctx, a, wait)
	if err == nil && g.kind == final {
		err = g.err
	}
	if err != nil || (g.kind != taken && g.kind != handed) {
		return false, err
	}
	if s.cfg.replicas > 0 {
		spec := s.renewSpec(mode, tok)
		if err := s.c.replicated(ctx, s.cfg, spec.Script, spec.Keys, spec.Args...); err != nil {
			s.c.cleanup(ctx, a.abandon)
			return false, err
		}
	}
	// For a read hold, g.fence is its hold id (see s.attempt).
	if err := rw.held(mode, c, g.fence, func() *hold {
		return s.c.startHold(s.cfg, s.renewSpec(mode, tok), tok, g.fence, start)
	}); err != nil {
		// errRegrant, as for Mutex (mutexScripts.lock).
		s.c.cleanup(ctx, a.abandon)
		return false, err
	}
	return true, nil
}

// attempt runs the lock script once. starving makes a refused writer take
// a place in the writers' queue.
func (s *rwScripts) attempt(ctx context.Context, mode, tok, id, secret string, wait, starving bool) (grant, error) {
	w, local, q := "0", "0", "0"
	if wait {
		w = "1"
	}
	if s.cfg.local {
		local = "1"
	}
	if starving {
		q = "1"
	}
	r, err := s.c.acquirePair(ctx, s.cfg, rwLock, s.kargs, mode, tok, ms(s.cfg.ttl), id, w, ms(fenceIdle), local, q, secret)
	code, v, err := pair("rwmutex lock", r, err)
	if err != nil {
		return grant{}, err
	}
	// A read hold carries no fencing token; its grant carries its hold id
	// instead, which its RUnlock names (see rwmutex_unlock.lua) and its
	// Lease does not show.
	if g, ok, err := decodeGrant(code, v, true, s.what); ok {
		return g, err
	}
	if code == 4 {
		return grant{kind: final, err: ErrUpgrade}, nil
	}
	return grant{}, replyError("rwmutex lock", code)
}

// abandon undoes whatever a failed lock call may have done on the server.
func (s *rwScripts) abandon(ctx context.Context, mode, tok, id string) {
	local := argNo
	if s.cfg.local {
		local = argYes
	}
	_ = s.c.eval(ctx, rwUnlock, s.kargs, mode, tok, newCallID(), s.ch, argNone, id, argNone, fenceIdleArg, local).Err()
}

// unlock runs the unlock script for a release of h. It names the hold it
// ends (its fencing token, or a read hold's id), so that a late copy of it
// never ends a later hold.
func (s *rwScripts) unlock(ctx context.Context, mode, tok, id string, h *hold) (int64, error) {
	return s.unlockFloor(ctx, mode, tok, id, argNone, h.fenceArg())
}

// unlockFloor runs the unlock script for a release; floor, if set, raises
// the fencing counter to it, and name, if set, names the hold the unlock
// ends.
func (s *rwScripts) unlockFloor(ctx context.Context, mode, tok, id string, floor, name any) (int64, error) {
	return s.c.eval(ctx, rwUnlock, s.kargs, mode, tok, id, s.ch, name, argNone, floor, fenceIdleArg).Int64()
}

// renewSpec describes the renewal of tok's hold in mode.
func (s *rwScripts) renewSpec(mode, tok string) renew.Spec {
	if mode == modeRead {
		return renew.Spec{Batch: rwRRenew, Keys: s.keys[2:4], Args: []any{tok, ms(s.cfg.ttl)}}
	}
	return renew.Spec{Batch: mutexRenew, Keys: s.keys[:1], Args: []any{tok, ms(s.cfg.ttl)}}
}
