package dsync

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

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
	lockArg  any    // mutex_lock's ARGV[6]: localArg, or '2'/'3' with FixedLease or MaxHold
	what     string // how errors name the Mutex

	// The Client's cohorts (see cohort.go), through which the handle's
	// Lock calls without an owner wait; nil in quorum mode and with
	// WaitReplicas, whose grants need more than a release's reply.
	co *cohorts
}

func newMutexScripts(c *Client, cfg *config, k keys.Mutex, name string) *mutexScripts {
	s := &mutexScripts{c: c, cfg: cfg, keys: k.Keys(), chanArg: k.Channel(), localArg: argNo}
	s.kargs = boxKeys(s.keys)
	s.ttlArg = ms(cfg.ttl)
	s.what = "Mutex " + strconv.Quote(name)
	if cfg.local {
		s.localArg = argYes
	}
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

// lock takes the hold through the engine (see mutexImpl). A Lock call
// without an owner goes through the Client's cohort of the name (see
// cohort.go): it may wait in the process for a release to pass it the
// lock.
func (s *mutexScripts) lock(ctx context.Context, m *Mutex, c lockCall, wait bool) (bool, error) {
	if !s.c.begin() {
		return false, ErrClosed
	}
	defer s.c.end()
	if c.owned {
		// An Unlock of the owner that names no hold, and ends the one this
		// call is granted before the call learns of it, is noted for it.
		k := holdKey{s.keys[0], c.tok}
		s.c.ownerFlightBegin(k)
		defer s.c.ownerFlightEnd(k)
	}
	mc := &mutexCall{s: s, m: m, c: c, tok: c.tok}
	mc.acquisition = acquisition{ch: s.chanArg.(string), to: newAddressee(c.tok, newCallID(), s.c.notify.inboxFor(c.owned)), ttl: s.cfg.ttl, timed: true}
	mc.c.ordered = true
	l := lockOf{a: &mc.acquisition, op: mc, tok: mc.tok, wait: wait, cohort: wait && !c.owned && s.co != nil, key: s.keys[0], ttlArg: s.ttlArg}
	if s.cfg.replicas > 0 {
		l.replicate = func(g grant) error {
			if g.kind != handed {
				return nil // checked by the WAIT sent with the attempt (see acquirePair)
			}
			// Make sure the hand-over reached the replicas.
			return s.c.replicated(ctx, s.cfg, mutexRenew, s.keys[:1], mc.tok, s.ttlArg, holdID{fence: g.fence, fenceArg: g.fenceArg}.arg())
		}
	}
	return s.c.lockHold(ctx, s.cfg.ttl, l)
}

// held records the hold that grant g gave call mc of m, whose lease starts
// at start; member says the call is a member of its cohort, which the
// hold's first release or its loss ends (see Client.startHoldOf).
func (s *mutexScripts) held(ctx context.Context, m *Mutex, c lockCall, mc *mutexCall, g grant, start time.Time, member bool) (bool, error) {
	if _, err := m.held(c, g.fence, func() *hold {
		id := holdID{tok: c.tok, tokArg: mc.tok, fence: g.fence, fenceArg: g.fenceArg}
		return s.c.startHoldOf(s.cfg, s.renewSpec(mc.tok, id.arg()), id, start, member, s.keys[0])
	}); err != nil {
		// errRegrant: the hold may be one a release in this process is
		// ending; errSuperseded: its hold has ended. Undo the call; the
		// caller takes the hold again. (Owners only: their calls are no
		// cohort members.)
		s.c.cleanup(ctx, mc)
		return false, err
	}
	return true, nil
}

// A mutexCall is one Lock or TryLock call of a handle, as the engine drives
// it (see acquirer).
type mutexCall struct {
	acquisition
	s     *mutexScripts
	m     *Mutex
	c     lockCall
	tok   any   // the holder token, boxed once for the call's scripts
	cmd   []any // the lock script's command, built by the first attempt
	queue bool  // whether cmd takes a queue place
}

func (mc *mutexCall) attempt(ctx context.Context, queue bool) (grant, error) {
	if mc.cmd == nil || mc.queue != queue {
		mc.cmd, mc.queue = mc.s.lockCmd(mc.tok, mc.to.id, mc.to.secret, queue), queue
	}
	return mc.s.attemptCmd(ctx, mc.cmd)
}

func (mc *mutexCall) record(ctx context.Context, g grant, start time.Time, member bool) (bool, error) {
	return mc.s.held(ctx, mc.m, mc.c, mc, g, start, member)
}

func (mc *mutexCall) abandon(ctx context.Context) error { return mc.s.abandon(ctx, mc.tok, mc.to.id) }

func (mc *mutexCall) restart() {
	mc.to = mc.to.next(newCallID())
	mc.cmd = nil
}

// lockCmd returns the lock script's command for call id of holder tok, whose
// hand-overs prove secret. With queue, a refused caller takes (or keeps) a
// place in the queue.
func (s *mutexScripts) lockCmd(tok any, id, secret string, queue bool) []any {
	return scriptCall(mutexLock, s.kargs, tok, s.ttlArg, id, flagArg(queue), fenceIdleArg, s.lockArg, secret, argNone)
}

// argWaits is the lock script's ARGV[4] for a Lock that waits without a
// place in the queue (quorum mode).
var argWaits any = "2"

// attemptUnqueued runs the lock script once for a call that takes no place
// in the queue (quorum mode): a Lock (wait), whose refusal has the release
// notify the waiters, or a TryLock.
func (s *mutexScripts) attemptUnqueued(ctx context.Context, tok any, id string, wait bool) (grant, error) {
	w := argNo
	if wait {
		w = argWaits
	}
	return s.attemptCmd(ctx, scriptCall(mutexLock, s.kargs, tok, s.ttlArg, id, w, fenceIdleArg, s.lockArg, "", argNone))
}

// attemptCmd runs a command made by lockCmd.
func (s *mutexScripts) attemptCmd(ctx context.Context, cmd []any) (grant, error) {
	r, err := s.c.acquirePair(ctx, s.cfg, mutexLock, "mutex lock", cmd)
	if err != nil {
		return grant{}, err
	}
	g, ok, err := decodeGrant(r, true, s.what)
	if !ok {
		return grant{}, replyError("mutex lock", r.code)
	}
	return g, err
}

// abandon undoes whatever the lock call id of tok may have done.
func (s *mutexScripts) abandon(ctx context.Context, tok any, id string) error {
	return s.c.eval(ctx, mutexUnlock, s.kargs, tok, newCallID(), s.chanArg, fenceIdleArg, id, argNone, argNone, s.localArg).Err()
}

// unlock runs the unlock script, naming the hold h ends. The first release
// of a cohort member's hold (see cohort.go) ends the membership, whatever
// its outcome: it passes the lock to the first call of the cohort waiting
// in the process, if there is one, or that call takes its turn in Redis;
// with none, the cohort has one member less. (A hold whose release failed
// may still be in Redis: a call that tries then waits there, as for any
// other holder, rather than for a release that may never come.)
func (s *mutexScripts) unlock(ctx context.Context, tok, id string, h *hold) (int64, error) {
	if h == nil || !h.cohort.CompareAndSwap(true, false) {
		return s.unlockFloor(ctx, h.tokArg(tok), id, argNone, h.fenceArg())
	}
	rep, passed, err := s.c.cohortRelease(ctx, s.keys[0], func(w *cohortWaiter) (any, error) {
		if w == nil {
			return s.c.eval(ctx, mutexUnlock, s.kargs, h.tokArg(tok), id, s.chanArg, fenceIdleArg, argNone, argNone, h.fenceArg()).Result()
		}
		return s.c.eval(ctx, mutexUnlock, s.kargs, h.tokArg(tok), id, s.chanArg, fenceIdleArg, argNone, argNone, h.fenceArg(), s.localArg,
			w.tok, w.id, w.ttl, cohortPassesArg).Result()
	}, func(w *cohortWaiter) abandoner {
		return &mutexCall{s: s, tok: w.tok, acquisition: acquisition{to: addressee{id: w.id}}}
	})
	return releaseCode(rep, passed, err, "mutex unlock")
}

// unlockFloor runs the unlock script for holder tok with call id; floor,
// if set, raises the fencing counter to it, and fence, if set, names the
// hold the unlock ends. It carries a bound (see boundedRelease): a copy
// of an unlock that names no hold would end a level of whatever hold of
// the holder it finds, and one of an unlock that lowered the count of the
// hold it names would lower it again, delivered once its id is forgotten.
// The hold an unlock naming none ended, if any, is noted for the Lock
// calls of its holder in flight (see ownerFlight), which it may have been
// granted to.
func (s *mutexScripts) unlockFloor(ctx context.Context, tok any, id string, floor, fence any) (int64, error) {
	r, ended, err := boundedRelease(&s.c.clock, "mutex unlock", func(bound any) *redis.Cmd {
		return s.c.eval(ctx, mutexUnlock, s.kargs, tok, id, s.chanArg, fenceIdleArg, argNone, floor, fence,
			argNone, argNone, argNone, argNone, argNone, bound)
	})
	if t, ok := tok.(string); ok && ended != 0 {
		// (tok, naming no hold, is the holder token as it came.)
		s.c.unnamedEnded(s.cfg, s.keys[0], t, ended, true)
		if q := s.c.quorum; q != nil {
			q.memberEnded(s.c.member, s.cfg, s.keys[0], t, ended)
		}
	}
	return r, err
}

// renewSpec describes the renewal of tok's hold with fencing token fence.
func (s *mutexScripts) renewSpec(tok, fence any) renew.Spec {
	return renew.Spec{Batch: mutexRenew, Keys: s.keys[:1], Args: []any{tok, s.ttlArg, fence}}
}
