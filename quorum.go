package dsync

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/renew"
)

// Quorum mode (Redlock). A Client made by NewQuorum holds one member Client
// per independent master. A Mutex or RWMutex handle holds one member handle
// per master and runs the ordinary scripts on all of them in parallel: a
// lock is granted when a majority granted it within its validity, and every
// failed attempt is undone on the members (an RWMutex call that waits keeps
// its waiting places on the members that refused it until the call ends). Each member keeps its own lease of the
// hold alive through its own renewer; the hold's Lease is lost as soon as
// fewer than a majority of those leases are alive.
//
// Fencing tokens. The token of a quorum hold is the largest of the tokens
// its granting masters issued; each master issues max(last+1, its clock in
// µs). Two holds H1 and H2, H2 granted after H1 ended, share at least one
// master k (two majorities intersect), and k issued H2's token after H1's,
// so tok(H2) ≥ tok_k(H2) > tok_k(H1). That makes tok(H2) > tok(H1) when
// tok(H1) was issued by k itself or by a master whose clock is not ahead of
// k's by more than the time between the two grants on k. When H1 expired
// (its holder died) that time is at least the TTL, so tokens are monotonic
// as long as the masters' clocks differ by less than the TTL and no master's
// counter runs ahead of its clock (a clock stepped back). After an Unlock,
// H2 may be granted within microseconds, so Unlock sends tok(H1) to every
// master, which raises its counter to it: k then issues tok_k(H2) >
// tok(H1). A master that missed that Unlock still held H1 and could not
// grant H2 before H1's lease ran out there, which brings back the TTL gap
// above. Keep the masters' clocks within a TTL of each other (NTP) if
// storage relies on tokens.

// redlockDrift is the clock drift allowance of Redlock's validity time,
// the same allowance renew uses for conservative deadlines.
func redlockDrift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// splitBackoff bounds the random pause after an attempt that took some but
// too few masters, so that contenders that split the masters do not retry
// in lockstep.
const splitBackoff = 5 * time.Millisecond

// foreverTTL is the lease length of a quorum hold's own (never renewed)
// lease: it ends when released or when its members' leases are lost.
const foreverTTL = 100 * 365 * 24 * time.Hour

type quorum struct {
	members []*Client
	need    int            // N/2+1
	wg      sync.WaitGroup // watchers of quorum holds
	refuse  *redis.Client  // the Client's own rdb, which refuses every command
}

// NewQuorum returns a Client whose Mutexes and RWMutexes use the Redlock
// algorithm over the independent masters clients (which must not be
// replicas or nodes of one cluster of each other): a Lock (or RLock) is
// granted when a majority, N/2+1, of the masters granted it within validity
// = TTL − elapsed − drift (drift = TTL/100 + 2 ms), and released on all
// masters otherwise and on Unlock. The hold is renewed on every master that
// granted it and its [Lease] reports [ErrLeaseLost] once fewer than a
// majority still hold it. A lock or unlock call that fewer than a majority
// of masters answer fails with an error matching [ErrNoQuorum]. Each
// attempt costs one round trip to every master, in parallel; waiting,
// ownership and reentrancy are as on a single master, and each master keeps
// an RWMutex's writer preference as a single one does.
//
// Semaphore and Once fail every call with [ErrInvalid]: a semaphore's
// permits and a once's done mark have no Redlock counterpart whose safety
// is shown. See the package documentation's scaling notes for fencing
// tokens.
//
// Options are as for [New]. Close stops the Client and its members; it does
// not close the Redis clients.
func NewQuorum(clients []redis.UniversalClient, opts ...Option) *Client {
	refuse := refusingClient()
	c := newBase(refuse)
	c.cfg.apply(opts)
	c.err = c.cfg.err
	switch {
	case c.err != nil:
	case len(clients) == 0:
		c.err = fmt.Errorf("%w: NewQuorum without clients", ErrInvalid)
	case c.cfg.replicas > 0:
		c.err = fmt.Errorf("%w: WaitReplicas in quorum mode", ErrInvalid)
	}
	for i, rdb := range clients {
		if rdb == nil && c.err == nil {
			c.err = fmt.Errorf("%w: nil redis client %d of %d", ErrInvalid, i, len(clients))
		}
	}
	if c.err != nil {
		_ = refuse.Close()
		return c
	}
	q := &quorum{need: len(clients)/2 + 1, refuse: refuse}
	for _, rdb := range clients {
		q.members = append(q.members, New(rdb, opts...))
	}
	c.q = q
	// The Client's own renewer only carries the quorum holds' leases, which
	// it never renews: their members are renewed by the members.
	c.renew = renew.New(refuse, renew.LostError(ErrLeaseLost))
	c.notify = newNotifier(refuse)
	return c
}

var errQuorumOnly = fmt.Errorf("%w: quorum mode (NewQuorum) supports only Mutex and RWMutex", ErrInvalid)

// refusingClient returns a Redis client that fails every command with
// errQuorumOnly before any I/O: what other primitives send through a quorum
// Client's own connection.
func refusingClient() *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0", MaxRetries: -1})
	rdb.AddHook(refuseHook{})
	return rdb
}

type refuseHook struct{}

func (refuseHook) DialHook(redis.DialHook) redis.DialHook {
	return func(context.Context, string, string) (net.Conn, error) { return nil, errQuorumOnly }
}

func (refuseHook) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(_ context.Context, cmd redis.Cmder) error {
		cmd.SetErr(errQuorumOnly)
		return errQuorumOnly
	}
}

func (refuseHook) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(_ context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			cmd.SetErr(errQuorumOnly)
		}
		return errQuorumOnly
	}
}

func (q *quorum) close() {
	for _, m := range q.members {
		m.Close()
	}
	q.wg.Wait()
	_ = q.refuse.Close()
}

// members makes one member handle per master with mk.
func members[T any](q *quorum, mk func(c *Client) T) []T {
	subs := make([]T, len(q.members))
	for i, c := range q.members {
		subs[i] = mk(c)
	}
	return subs
}

// mutexes returns the member handles of a quorum Mutex.
func (q *quorum) mutexes(name string, opts []Option) []*Mutex {
	return members(q, func(c *Client) *Mutex { return c.Mutex(name, opts...) })
}

// rwmutexes returns the member handles of a quorum RWMutex.
func (q *quorum) rwmutexes(name string, opts []Option) []*RWMutex {
	return members(q, func(c *Client) *RWMutex { return c.RWMutex(name, opts...) })
}

// answers collects one reply per member.
type answers struct {
	v    []int64
	err  []error
	got  int // members that answered
	hits int // members whose reply is a grant (> 0)
	max  int64
}

// each runs f on every member handle in parallel and collects the replies.
func each[T any](subs []T, f func(i int, sub T) (int64, error)) answers {
	n := len(subs)
	a := answers{v: make([]int64, n), err: make([]error, n)}
	var wg sync.WaitGroup
	for i, sub := range subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.v[i], a.err[i] = f(i, sub)
		}()
	}
	wg.Wait()
	for i := range n {
		if a.err[i] != nil {
			continue
		}
		a.got++
		if a.v[i] > 0 {
			a.hits++
			a.max = max(a.max, a.v[i])
		}
	}
	return a
}

func (a answers) noQuorum(need int) error {
	var first error
	for _, err := range a.err {
		if err != nil {
			first = err
			break
		}
	}
	return fmt.Errorf("%w: %d of %d answered, need %d: %w", ErrNoQuorum, a.got, len(a.v), need, first)
}

// unlocked sums up the members' replies to an unlock script (1 released, 2
// still held with a lower count, 0 not held) as one master's reply would
// be: 2 if a majority lowered the count, 1 if a majority released or
// lowered it, 0 otherwise. Fewer than a majority answering is an error
// matching ErrNoQuorum: the outcome is unknown.
func (a answers) unlocked(need int) (int64, error) {
	if a.got < need {
		return 0, a.noQuorum(need)
	}
	var released, lowered int
	for i, v := range a.v {
		switch {
		case a.err[i] != nil:
		case v == 1:
			released++
		case v == 2:
			lowered++
		}
	}
	switch {
	case lowered >= need:
		return 2, nil
	case released+lowered >= need:
		return 1, nil
	}
	return 0, nil
}

// A quorumCall is one lock call of a primitive in quorum mode, as the
// Redlock loop (quorum.lock) sees it.
type quorumCall struct {
	channel string // the name's notification channel on every master
	ttl     time.Duration
	// try makes one attempt on member i under call id id: > 0 a grant,
	// < 0 minus the ms to wait at most, 0 as below.
	try func(i int, id string) (int64, error)
	// undo undoes on member i whatever the attempts under id did, detached
	// from the call's ctx.
	undo func(i int, id string)
	// zero, if set, is what a reply of 0 from any member ends the call
	// with (RWMutex: ErrUpgrade); otherwise 0 is a refusal.
	zero error
	// keep: a member that refused a waiting call keeps the caller's
	// waiting place, and the call keeps its call id there, until the call
	// ends (RWMutex: a waiting writer holds back new readers, a waiting
	// reader is granted by a writer's Unlock).
	keep bool
}

// lock runs the Redlock loop of one call for tok: every attempt on all
// members in parallel, granted when a majority granted it within its
// validity, undone otherwise. On a grant it returns the replies and a time
// no later than the start of every granting member's lease.
func (q *quorum) lock(ctx context.Context, closed chan struct{}, k *quorumCall, tok string, wait bool) (answers, time.Time, error) {
	n := len(q.members)
	ids := make([]string, n)      // each member's call id; "" once undone
	since := make([]time.Time, n) // no later than a grant under ids[i] began
	undo := func(which func(i int) bool) {
		todo := make([]bool, n)
		some := false
		for i := range todo {
			todo[i] = ids[i] != "" && which(i)
			some = some || todo[i]
		}
		if !some {
			return
		}
		each(q.members, func(i int, _ *Client) (int64, error) {
			if todo[i] {
				k.undo(i, ids[i])
				ids[i] = ""
			}
			return 0, nil
		})
	}
	all := func(int) bool { return true }
	var ws []*watcher
	defer func() {
		for i, w := range ws {
			q.members[i].notify.unwatch(w)
		}
	}()
	var t *time.Timer
	for {
		// A fresh call id for the members whose last one was undone:
		// undoing an attempt marks its id abandoned on the master.
		id := newCallID()
		start := time.Now()
		for i := range ids {
			if ids[i] == "" {
				ids[i], since[i] = id, start
			}
		}
		a := each(q.members, func(i int, _ *Client) (int64, error) { return k.try(i, ids[i]) })
		first := start
		for i := range ids {
			if a.err[i] == nil && a.v[i] > 0 && since[i].Before(first) {
				first = since[i]
			}
			if a.err[i] == nil && a.v[i] < 0 {
				// A grant to the waiting place begins after this reply.
				since[i] = start
			}
		}
		if k.zero != nil {
			for i, v := range a.v {
				if a.err[i] == nil && v == 0 {
					undo(all)
					return answers{}, first, k.zero
				}
			}
		}
		validity := k.ttl - time.Since(first) - redlockDrift(k.ttl)
		if a.hits >= q.need && validity > 0 {
			// A member whose reply was lost may hold it, and one that
			// refused may keep a waiting place: undo there.
			undo(func(i int) bool { return a.err[i] != nil || (k.keep && a.v[i] <= 0) })
			return a, first, nil
		}
		more := wait && a.got >= q.need
		undo(func(i int) bool { return !more || !k.keep || a.err[i] != nil || a.v[i] > 0 })
		if a.got < q.need {
			if err := ctx.Err(); err != nil {
				return answers{}, first, err
			}
			return answers{}, first, a.noQuorum(q.need)
		}
		if !wait {
			return answers{}, first, nil
		}
		if ws == nil {
			// Watch every member's channel, then try again at once: a
			// release before the subscriptions may have been missed.
			for _, c := range q.members {
				ws = append(ws, c.notify.watch(k.channel))
			}
			for i, w := range ws {
				w.awaitReady(ctx, q.members[i].closed)
			}
			continue
		}
		// Sleep until a release on any master, or as long as the holds
		// that refused can last.
		d := k.ttl / 2
		for _, v := range a.v {
			if v < 0 {
				d = min(d, time.Duration(-v)*time.Millisecond)
			}
		}
		if a.hits > 0 {
			d = min(d, time.Duration(rand.Int64N(int64(splitBackoff))))
		}
		d = max(d, time.Millisecond)
		if t == nil {
			t = time.NewTimer(d)
			defer t.Stop()
		} else {
			t.Reset(d)
		}
		if err := sleep(ctx, closed, ws, t); err != nil {
			undo(all) // the waiting places kept
			return answers{}, first, err
		}
	}
}

func (m *Mutex) quorumLock(ctx context.Context, otok, tok string, owned, wait bool) (bool, error) {
	a, start, err := m.c.q.lock(ctx, m.c.closed, &quorumCall{
		channel: m.keys[0],
		ttl:     m.cfg.ttl,
		try: func(i int, id string) (int64, error) {
			g, err := m.subs[i].attempt(ctx, tok, id, argNone.(string), false)
			switch {
			case err != nil:
				return 0, err
			case g.kind == taken || g.kind == handed:
				return int64(g.fence), nil
			case g.kind == final:
				return 0, g.err
			}
			return -max(g.wait.Milliseconds(), 1), nil
		},
		undo: func(i int, id string) {
			sub := m.subs[i]
			dctx, cancel := detached(ctx)
			defer cancel()
			_ = sub.c.eval(dctx, mutexUnlock, sub.kargs, tok, newCallID(), sub.chanArg, fenceIdleArg, id, argNone, argNone).Err()
		},
	}, tok, wait)
	if err != nil || a.v == nil {
		if !owned {
			m.slot.leave()
		}
		return false, err
	}
	m.quorumHeld(otok, tok, owned, a, start)
	return true, nil
}

// sleep waits for the timer, a notification on any member, ctx or Close.
func sleep(ctx context.Context, closed chan struct{}, ws []*watcher, t *time.Timer) error {
	cases := make([]reflect.SelectCase, 0, len(ws)+3)
	cases = append(cases,
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(closed)},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(t.C)})
	for _, w := range ws {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.sig)})
	}
	switch i, _, _ := reflect.Select(cases); i {
	case 0:
		return ctx.Err()
	case 1:
		return ErrClosed
	}
	return nil
}

// quorumHold makes the hold of a quorum grant a: one member hold per
// granting master, started by sub(i) and renewed by that member, and the
// hold's own lease, lost when fewer than a majority of member holds are
// alive.
func (c *Client) quorumHold(tok string, fence uint64, a answers, start time.Time, sub func(i int) *hold) *hold {
	h := &hold{tok: tok, fence: fence, count: 1, lease: c.renew.Add(renew.Spec{
		TTL: foreverTTL, Interval: -1, Start: start,
	})}
	h.subs = make([]*hold, len(a.v))
	for i := range h.subs {
		if a.err[i] == nil && a.v[i] > 0 {
			h.subs[i] = sub(i)
		}
	}
	c.q.watch(h)
	return h
}

// quorumHeld records a quorum hold of m.
func (m *Mutex) quorumHeld(otok, tok string, owned bool, a answers, start time.Time) {
	fence := uint64(a.max)
	newHold := func() *hold {
		return m.c.quorumHold(tok, fence, a, start, func(i int) *hold {
			sub := m.subs[i]
			return sub.c.startHold(&sub.cfg, renew.Spec{
				Script: mutexRenew,
				Keys:   sub.keys[:1],
				Args:   []any{tok, sub.ttlArg},
			}, tok, uint64(a.v[i]), start)
		})
	}
	if owned {
		m.c.ownerHold(holdKey{m.keys[0], otok}, fence, newHold)
		return
	}
	m.slot.set(newHold())
}

// watch marks h lost when fewer than a quorum of its member holds are
// alive, and stops renewing them when h ends.
func (q *quorum) watch(h *hold) {
	cases := []reflect.SelectCase{{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(h.lease.Done())}}
	alive := 0
	for _, s := range h.subs {
		if s != nil {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(s.lease.Done())})
			alive++
		}
	}
	q.wg.Add(1)
	go func() {
		defer q.wg.Done()
		for alive >= q.need {
			i, _, _ := reflect.Select(cases)
			if i == 0 {
				break
			}
			cases[i].Chan = reflect.Value{} // ended: never selected again
			alive--
		}
		if alive < q.need {
			h.lease.MarkLost()
		}
		h.releaseSubs()
	}()
}

// releaseSubs stops renewing the member holds of a quorum hold.
func (h *hold) releaseSubs() {
	for _, s := range h.subs {
		if s != nil {
			s.release()
		}
	}
}

func (m *Mutex) quorumUnlock(ctx context.Context) error {
	otok, owned, err := owner(ctx)
	if err != nil {
		return err
	}
	var h *hold
	var tok string
	if owned {
		if m.cfg.local && m.c.leave(holdKey{m.keys[0], otok}) {
			return nil
		}
		tok = m.c.holderToken(&m.cfg, otok)
		h = m.c.lookupHold(holdKey{m.keys[0], otok})
	} else {
		if h = m.slot.get(); h == nil {
			return ErrNotHeld
		}
		tok = h.tok
	}
	id := newCallID()
	if h != nil {
		id = h.unlockCall()
	}
	forget := func() {
		if owned {
			m.c.dropHold(holdKey{m.keys[0], otok}, h)
		} else if m.slot.clear(h) {
			m.slot.leave()
		}
	}
	dctx, cancel := releaseContext(ctx)
	defer cancel()
	floor := floorArg(h)
	a := each(m.subs, func(_ int, sub *Mutex) (int64, error) {
		return sub.c.eval(dctx, mutexUnlock, sub.kargs, tok, id, sub.chanArg, fenceIdleArg, argNone, floor, argNone).Int64()
	})
	r, err := a.unlocked(m.c.q.need)
	if err != nil {
		// The outcome is unknown: keep the hold, and let a retry reuse id.
		return err
	}
	if h != nil {
		h.unlocked()
	}
	switch {
	case r == 2:
		if h != nil && owned {
			m.c.mu.Lock()
			h.count--
			last := h.count <= 0
			m.c.mu.Unlock()
			if last {
				forget()
				h.releaseAll()
			}
		}
		return nil
	case r == 1:
		if h != nil {
			forget()
			h.releaseAll()
		}
		return nil
	case h != nil:
		// Fewer than a majority still had it: it was lost before Unlock.
		forget()
		h.lease.MarkLost()
		h.releaseSubs()
		return ErrLeaseLost
	default:
		return ErrNotHeld
	}
}

// floorArg is the unlock script argument that raises every master's
// fencing counter to h's token (the largest its quorum issued), so that the
// next hold's token is larger wherever it is granted; none for a hold
// without a token or not known here.
func floorArg(h *hold) any {
	if h == nil || h.fence == 0 {
		return argNone
	}
	return strconv.FormatUint(h.fence, 10)
}

// releaseAll releases h and, for a quorum hold, stops renewing its member
// holds at once (its watcher would, a little later).
func (h *hold) releaseAll() {
	h.release()
	h.releaseSubs()
}

// quorumLock is RWMutex.lock in quorum mode. A read is granted when a
// majority of masters granted it, each with its own writer preference; a
// waiting caller keeps its waiting place on the masters that refused it
// between attempts, so a waiting writer holds back new readers there and a
// writer's Unlock there grants a waiting reader (whose next attempt finds
// the grant). An upgrade refused by any master undoes the call everywhere.
func (rw *RWMutex) quorumLock(ctx context.Context, mode, otok, tok string, owned, wait bool) (bool, error) {
	a, start, err := rw.c.q.lock(ctx, rw.c.closed, &quorumCall{
		channel: rw.keys[0],
		ttl:     rw.cfg.ttl,
		try: func(i int, id string) (int64, error) {
			// Never starving: quorum writers do not queue. Each master
			// would order its queue by the arrivals it saw and hand the
			// lock to different writers, splitting the grants.
			g, err := rw.subs[i].attempt(ctx, mode, tok, id, "-", wait, false)
			switch {
			case err != nil:
				return 0, err
			case g.kind == taken || g.kind == handed:
				if mode == modeRead {
					return 1, nil
				}
				return int64(g.fence), nil
			case g.kind == final && errors.Is(g.err, ErrUpgrade):
				return 0, nil
			case g.kind == final:
				return 0, g.err
			}
			return -max(g.wait.Milliseconds(), 1), nil
		},
		undo: func(i int, id string) {
			dctx, cancel := detached(ctx)
			defer cancel()
			rw.subs[i].abandon(dctx, mode, tok, id)
		},
		zero: ErrUpgrade,
		keep: true,
	}, tok, wait)
	if err != nil || a.v == nil {
		return false, err
	}
	fence := uint64(a.max)
	if mode == modeRead {
		fence = 0
	}
	rw.held(mode, otok, tok, owned, fence, start, &a)
	return true, nil
}

// quorumHold makes the quorum hold of grant a in mode.
func (rw *RWMutex) quorumHold(mode, tok string, fence uint64, a answers, start time.Time) *hold {
	return rw.c.quorumHold(tok, fence, a, start, func(i int) *hold {
		sub := rw.subs[i]
		f := uint64(a.v[i])
		if mode == modeRead {
			f = 0
		}
		return sub.c.startHold(&sub.cfg, sub.renewSpec(mode, tok), tok, f, start)
	})
}

// quorumUnlock runs the unlock script on every master and sums up their
// replies as one master's reply (see answers.unlocked). An Unlock raises
// every master's fencing counter to the write hold's token, as for Mutex.
func (rw *RWMutex) quorumUnlock(ctx context.Context, mode, tok, id string, h *hold) (int64, error) {
	floor := floorArg(h)
	a := each(rw.subs, func(_ int, sub *RWMutex) (int64, error) {
		return sub.c.eval(ctx, rwUnlock, sub.kargs, mode, tok, id, sub.keys[0], ms(finishedKeep), "", floor, ms(fenceIdle)).Int64()
	})
	return a.unlocked(rw.c.q.need)
}
