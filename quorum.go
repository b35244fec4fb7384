package dsync

import (
	"context"
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
// per independent master. A Mutex handle holds one member handle per master
// and runs the ordinary scripts on all of them in parallel: a lock is
// granted when a majority granted it within its validity, and every failed
// attempt is undone on all members. Each member keeps its own lease of the
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

// NewQuorum returns a Client whose Mutexes use the Redlock algorithm over
// the independent masters clients (which must not be replicas or nodes of
// one cluster of each other): a Lock is granted when a majority, N/2+1, of
// the masters granted it within validity = TTL − elapsed − drift (drift =
// TTL/100 + 2 ms), and released on all masters otherwise and on Unlock.
// The hold is renewed on every master that granted it and its [Lease]
// reports [ErrLeaseLost] once fewer than a majority still hold it. A Lock or
// Unlock that fewer than a majority of masters answer fails with an error
// matching [ErrNoQuorum]. Each Lock costs one round trip to every master, in
// parallel; waiting, ownership and reentrancy are as on a single master.
//
// Only Mutex works in quorum mode. RWMutex, Semaphore and Once fail every
// call with [ErrInvalid]: a semaphore's permits and a once's done mark have
// no Redlock counterpart whose safety is shown. See the package
// documentation's scaling notes for fencing tokens.
//
// Options are as for [New]. Close stops the Client and its members; it does
// not close the Redis clients.
func NewQuorum(clients []redis.UniversalClient, opts ...Option) *Client {
	refuse := refusingClient()
	c := &Client{
		rdb:    refuse,
		cfg:    defaultConfig(),
		holds:  make(map[holdKey]*hold),
		closed: make(chan struct{}),
	}
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

var errQuorumOnly = fmt.Errorf("%w: quorum mode (NewQuorum) supports only Mutex", ErrInvalid)

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

// mutexes returns the member handles of a quorum Mutex.
func (q *quorum) mutexes(name string, opts []Option) []*Mutex {
	subs := make([]*Mutex, len(q.members))
	for i, c := range q.members {
		subs[i] = c.Mutex(name, opts...)
	}
	return subs
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
func (m *Mutex) each(f func(i int, sub *Mutex) (int64, error)) answers {
	n := len(m.subs)
	a := answers{v: make([]int64, n), err: make([]error, n)}
	var wg sync.WaitGroup
	for i, sub := range m.subs {
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

func (m *Mutex) quorumLock(ctx context.Context, wait bool) (bool, error) {
	tok, owned, err := owner(ctx)
	if err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if owned && m.cfg.local && m.c.reenter(holdKey{m.keys[0], tok}) {
		return true, nil
	}
	if !owned {
		tok = newToken()
	}
	q := m.c.q
	var ws []*watcher
	defer func() {
		for i, w := range ws {
			q.members[i].notify.unwatch(w)
		}
	}()
	var t *time.Timer
	for {
		// A fresh call id per attempt: undoing an attempt marks its id
		// abandoned on every master.
		id := newCallID()
		start := time.Now()
		a := m.each(func(_ int, sub *Mutex) (int64, error) { return sub.attempt(ctx, tok, id, false) })
		validity := m.cfg.ttl - time.Since(start) - redlockDrift(m.cfg.ttl)
		if a.hits >= q.need && validity > 0 {
			if a.got < len(a.v) {
				// A member whose reply was lost may hold it: undo there.
				m.undo(ctx, tok, id, a.err)
			}
			m.quorumHeld(tok, owned, a, start)
			return true, nil
		}
		m.undo(ctx, tok, id, nil)
		if a.got < q.need {
			if err := ctx.Err(); err != nil {
				return false, err
			}
			return false, a.noQuorum(q.need)
		}
		if !wait {
			return false, nil
		}
		if ws == nil {
			// Watch every member's channel, then try again at once: a
			// release before the subscriptions may have been missed.
			for _, c := range q.members {
				ws = append(ws, c.notify.watch(m.keys[0], tok))
			}
			for i, w := range ws {
				w.awaitReady(ctx, q.members[i].closed)
			}
			continue
		}
		// Sleep until a release on any master, or as long as the holds
		// that refused can last.
		d := m.cfg.ttl / 2
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
		if err := m.sleep(ctx, ws, t); err != nil {
			return false, err
		}
	}
}

// sleep waits for the timer, a notification on any member, ctx or Close.
func (m *Mutex) sleep(ctx context.Context, ws []*watcher, t *time.Timer) error {
	cases := make([]reflect.SelectCase, 0, len(ws)+3)
	cases = append(cases,
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(m.c.closed)},
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

// undo releases, on every member (or, with only set, on the members whose
// err is not nil), whatever the attempt id may have taken. It runs detached
// from ctx and in parallel.
func (m *Mutex) undo(ctx context.Context, tok, id string, only []error) {
	m.each(func(i int, sub *Mutex) (int64, error) {
		if only == nil || only[i] != nil {
			sub.abandon(ctx, tok, id)
		}
		return 0, nil
	})
}

// quorumHeld records a quorum hold: one member hold per granting master,
// renewed by that member, and the hold's own lease, lost when fewer than a
// majority of member holds are alive.
func (m *Mutex) quorumHeld(tok string, owned bool, a answers, start time.Time) {
	fence := uint64(a.max)
	newHold := func() *hold {
		h := &hold{tok: tok, fence: fence, count: 1, lease: m.c.renew.Add(renew.Spec{
			TTL: foreverTTL, Interval: -1, Start: start,
		})}
		h.subs = make([]*hold, len(m.subs))
		for i, sub := range m.subs {
			if a.err[i] == nil && a.v[i] > 0 {
				h.subs[i] = sub.c.startHold(&sub.cfg, renew.Spec{
					Script: mutexRenew,
					Keys:   sub.keys[:1],
					Args:   []any{tok, sub.ttlArg},
				}, tok, uint64(a.v[i]), start)
			}
		}
		m.c.q.watch(h)
		return h
	}
	if owned {
		m.c.ownerHold(holdKey{m.keys[0], tok}, fence, newHold)
		return
	}
	h := newHold()
	m.mu.Lock()
	old := m.cur
	m.cur = h
	m.mu.Unlock()
	if old != nil {
		old.release()
		old.releaseSubs()
	}
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
	tok, owned, err := owner(ctx)
	if err != nil {
		return err
	}
	var h *hold
	if owned {
		if m.cfg.local && m.c.leave(holdKey{m.keys[0], tok}) {
			return nil
		}
		h = m.c.lookupHold(holdKey{m.keys[0], tok})
	} else {
		m.mu.Lock()
		h = m.cur
		m.mu.Unlock()
		if h == nil {
			return ErrNotHeld
		}
		tok = h.tok
	}
	id := newCallID()
	if h != nil {
		m.mu.Lock()
		if h.unlockID != "" {
			id = h.unlockID
		}
		h.unlockID = id
		m.mu.Unlock()
	}
	// Every master learns the hold's token (the largest its quorum issued),
	// so the next hold's token is larger wherever it is granted.
	var floor any = argNone
	if h != nil {
		floor = strconv.FormatUint(h.fence, 10)
	}
	dctx, cancel := releaseContext(ctx)
	defer cancel()
	a := m.each(func(_ int, sub *Mutex) (int64, error) {
		return sub.c.eval(dctx, mutexUnlock, sub.kargs, tok, id, sub.chanArg, fenceIdleArg, argNone, floor).Int64()
	})
	need := m.c.q.need
	if a.got < need {
		// The outcome is unknown: keep the hold, and let a retry reuse id.
		return a.noQuorum(need)
	}
	if h != nil {
		m.mu.Lock()
		h.unlockID = ""
		m.mu.Unlock()
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
		if h != nil && owned {
			m.c.mu.Lock()
			h.count--
			last := h.count <= 0
			m.c.mu.Unlock()
			if last {
				m.forget(owned, tok, h)
				h.release()
				h.releaseSubs()
			}
		}
		return nil
	case released+lowered >= need:
		if h != nil {
			m.forget(owned, tok, h)
			h.release()
			h.releaseSubs()
		}
		return nil
	case h != nil:
		// Fewer than a majority still had it: it was lost before Unlock.
		m.forget(owned, tok, h)
		h.lease.MarkLost()
		h.releaseSubs()
		return ErrLeaseLost
	default:
		return ErrNotHeld
	}
}
