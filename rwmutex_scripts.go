package dsync

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

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

	// Script arguments boxed once per handle.
	chArg    any
	ttlArg   any
	localArg any // '1' with client reentrancy
	lockArg  any // rwmutex_lock's ARGV[7]: localArg, or '2'/'3' with FixedLease or MaxHold

	// The Client's cohorts (see cohort.go), through which the handle's
	// write Lock calls without an owner wait; nil in quorum mode and with
	// WaitReplicas, as for Mutex.
	co *cohorts
}

func newRWScripts(c *Client, cfg *config, k keys.RWMutex, name string) *rwScripts {
	s := &rwScripts{c: c, cfg: cfg, keys: k.Keys(), ch: k.Channel(), what: "RWMutex " + strconv.Quote(name)}
	s.kargs = boxKeys(s.keys)
	s.chArg = s.ch
	s.ttlArg = ms(cfg.ttl)
	s.localArg = flagArg(cfg.local)
	s.lockArg = s.localArg
	if cfg.interval < 0 || cfg.maxHold > 0 {
		// A lease that is not to be extended past a bound (FixedLease,
		// MaxHold): a re-entry does not extend the hold in Redis, whose
		// renewals (if any) keep within the bound.
		s.lockArg = "2"
		if cfg.local {
			s.lockArg = "3"
		}
	}
	return s
}

// Lock modes boxed once, as script arguments.
var (
	modeReadArg  any = modeRead
	modeWriteArg any = modeWrite
)

func modeArg(mode string) any {
	if mode == modeRead {
		return modeReadArg
	}
	return modeWriteArg
}

// lock takes the hold through the engine (see rwImpl). A write Lock call
// without an owner goes through the Client's cohort of the name, as a
// Mutex Lock does (see mutexScripts.lock).
func (s *rwScripts) lock(ctx context.Context, rw *RWMutex, mode string, c lockCall, wait bool) (bool, error) {
	if !s.c.begin() {
		return false, ErrClosed
	}
	defer s.c.end()
	if c.owned {
		// As for a Mutex (see mutexScripts.lock); an owner's RLock calls
		// are told of the read holds its RUnlocks end.
		k := holdKey{s.modeKey(mode), c.tok}
		s.c.ownerFlightBegin(k)
		defer s.c.ownerFlightEnd(k)
	}
	rc := &rwCall{s: s, rw: rw, c: c, mode: mode, tok: c.tok}
	rc.acquisition = acquisition{ch: s.ch, to: newAddressee(c.tok, newCallID(), s.c.notify.inboxFor(c.owned)), ttl: s.cfg.ttl, timed: mode == modeWrite}
	// A read hold's id is no fencing token: read grants are not ordered.
	rc.c.ordered = mode == modeWrite
	l := lockOf{a: &rc.acquisition, op: rc, tok: rc.tok, wait: wait, cohort: mode == modeWrite && wait && !c.owned && s.co != nil, key: s.keys[0], ttlArg: s.ttlArg}
	if s.cfg.replicas > 0 {
		l.replicate = func(g grant) error {
			spec := s.renewSpec(mode, rc.tok, holdID{fence: g.fence, fenceArg: g.fenceArg}.arg())
			return s.c.replicated(ctx, s.cfg, spec.Batch, spec.Keys, spec.Args...)
		}
	}
	return s.c.lockHold(ctx, s.cfg.ttl, l)
}

// held records the hold that grant g gave call rc of rw in mode, whose
// lease starts at start; member says the call is a member of its cohort
// (see Client.startHoldOf).
func (s *rwScripts) held(ctx context.Context, rw *RWMutex, mode string, c lockCall, rc *rwCall, g grant, start time.Time, member bool) (bool, error) {
	// For a read hold, g.fence is its hold id (see s.attempt).
	if _, err := rw.held(mode, c, g.fence, func() *hold {
		id := holdID{tok: c.tok, tokArg: rc.tok, fence: g.fence, fenceArg: g.fenceArg}
		return s.c.startHoldOf(s.cfg, s.renewSpec(mode, rc.tok, id.arg()), id, start, member, s.keys[0])
	}); err != nil {
		// errRegrant or errSuperseded, as for Mutex (mutexScripts.held).
		s.c.cleanup(ctx, rc)
		return false, err
	}
	return true, nil
}

// An rwCall is one lock call of a handle in one mode, as the engine drives
// it (see acquirer).
type rwCall struct {
	acquisition
	s     *rwScripts
	rw    *RWMutex
	c     lockCall
	mode  string
	tok   any   // the holder token, boxed once for the call's scripts
	cmd   []any // the lock script's command, built by the first attempt
	queue bool  // whether cmd waits and takes a queue place
}

func (rc *rwCall) attempt(ctx context.Context, queue bool) (grant, error) {
	if rc.cmd == nil || rc.queue != queue {
		// Writers queue from their first refused attempt, as Mutex
		// waiters do.
		rc.cmd, rc.queue = rc.s.lockCmd(rc.mode, rc.tok, rc.to.id, rc.to.secret, queue, queue), queue
	}
	return rc.s.attemptCmd(ctx, rc.cmd)
}

func (rc *rwCall) record(ctx context.Context, g grant, start time.Time, member bool) (bool, error) {
	return rc.s.held(ctx, rc.rw, rc.mode, rc.c, rc, g, start, member)
}

func (rc *rwCall) abandon(ctx context.Context) error {
	return rc.s.abandon(ctx, rc.mode, rc.tok, rc.to.id)
}

func (rc *rwCall) restart() {
	rc.to = rc.to.next(newCallID())
	rc.cmd = nil
}

// lockCmd returns the lock script's command for call id of holder tok in
// mode, whose hand-overs prove secret. wait makes a refused caller a
// waiter; starving makes a refused writer take a place in the writers'
// queue.
func (s *rwScripts) lockCmd(mode string, tok any, id, secret string, wait, starving bool) []any {
	return scriptCall(rwLock, s.kargs, modeArg(mode), tok, s.ttlArg, id, flagArg(wait), fenceIdleArg, s.lockArg, flagArg(starving), secret, argNone)
}

// attempt runs the lock script once (see lockCmd).
func (s *rwScripts) attempt(ctx context.Context, mode, tok, id, secret string, wait, starving bool) (grant, error) {
	return s.attemptCmd(ctx, s.lockCmd(mode, tok, id, secret, wait, starving))
}

// attemptCmd runs a command made by lockCmd.
func (s *rwScripts) attemptCmd(ctx context.Context, cmd []any) (grant, error) {
	r, err := s.c.acquirePair(ctx, s.cfg, rwLock, "rwmutex lock", cmd)
	if err != nil {
		return grant{}, err
	}
	// A read hold carries no fencing token; its grant carries its hold id
	// instead, which its RUnlock names (see rwmutex_unlock.lua) and its
	// Lease does not show.
	if g, ok, err := decodeGrant(r, true, s.what); ok {
		return g, err
	}
	if r.code == 4 {
		return grant{kind: final, err: ErrUpgrade}, nil
	}
	return grant{}, replyError("rwmutex lock", r.code)
}

// abandon undoes whatever a failed lock call may have done on the server.
func (s *rwScripts) abandon(ctx context.Context, mode string, tok any, id string) error {
	local := argNo
	if s.cfg.local {
		local = argYes
	}
	return s.c.eval(ctx, rwUnlock, s.kargs, modeArg(mode), tok, newCallID(), s.chArg, argNone, id, argNone, fenceIdleArg, local).Err()
}

// unlock runs the unlock script for a release of h. It names the hold it
// ends (its fencing token, or a read hold's id), so that a late copy of it
// never ends a later hold. The first release of a cohort member's write
// hold ends the membership, and may pass the lock on, as a Mutex's does
// (see mutexScripts.unlock).
func (s *rwScripts) unlock(ctx context.Context, mode, tok, id string, h *hold) (int64, error) {
	if h == nil || mode != modeWrite || !h.cohort.CompareAndSwap(true, false) {
		return s.unlockFloor(ctx, mode, h.tokArg(tok), id, argNone, h.fenceArg())
	}
	rep, passed, err := s.c.cohortRelease(ctx, s.keys[0], func(w *cohortWaiter) (any, error) {
		if w == nil {
			return s.c.eval(ctx, rwUnlock, s.kargs, modeWriteArg, h.tokArg(tok), id, s.chArg, h.fenceArg(), argNone, argNone, fenceIdleArg).Result()
		}
		return s.c.eval(ctx, rwUnlock, s.kargs, modeWriteArg, h.tokArg(tok), id, s.chArg, h.fenceArg(), argNone, argNone, fenceIdleArg, s.localArg,
			w.tok, w.id, w.ttl, cohortPassesArg).Result()
	}, func(w *cohortWaiter) abandoner {
		return &rwCall{s: s, mode: modeWrite, tok: w.tok, acquisition: acquisition{to: addressee{id: w.id}}}
	})
	return releaseCode(rep, passed, err, "rwmutex unlock")
}

// unlockFloor runs the unlock script for a release; floor, if set, raises
// the fencing counter to it, and name, if set, names the hold the unlock
// ends. It carries a bound, as a Mutex's does (see
// mutexScripts.unlockFloor).
func (s *rwScripts) unlockFloor(ctx context.Context, mode string, tok any, id string, floor, name any) (int64, error) {
	r, ended, err := boundedRelease(&s.c.clock, "rwmutex unlock", func(bound any) *redis.Cmd {
		return s.c.eval(ctx, rwUnlock, s.kargs, modeArg(mode), tok, id, s.chArg, name, argNone, floor, fenceIdleArg,
			argNone, argNone, argNone, argNone, argNone, bound)
	})
	if t, ok := tok.(string); ok && ended != 0 {
		// As for a Mutex (see mutexScripts.unlockFloor); a read hold is
		// named by its id, recorded under the readers key.
		s.c.unnamedEnded(s.cfg, s.modeKey(mode), t, ended, mode == modeWrite)
		if q := s.c.quorum; q != nil {
			q.memberEnded(s.c.member, s.cfg, s.modeKey(mode), t, ended)
		}
	}
	return r, err
}

// modeKey returns the key under which the holds in mode are recorded:
// the writer hash's, or the readers zset's (see RWMutex.modeKey).
func (s *rwScripts) modeKey(mode string) string {
	if mode == modeRead {
		return s.keys[2]
	}
	return s.keys[0]
}

// renewSpec describes the renewal of tok's hold in mode, named by fence
// (its fencing token, or a read hold's id).
func (s *rwScripts) renewSpec(mode string, tok, fence any) renew.Spec {
	if mode == modeRead {
		return renew.Spec{Batch: rwRRenew, Keys: s.keys[2:4], Args: []any{tok, s.ttlArg, fence}}
	}
	return renew.Spec{Batch: mutexRenew, Keys: s.keys[:1], Args: []any{tok, s.ttlArg, fence}}
}
