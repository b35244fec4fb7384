package dsync

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Quorum mode (Redlock) is a layer over the engine of one deployment. A
// Quorum holds one member Client per independent master; its Mutex and
// RWMutex handles are the handles of one deployment with another impl
// (quorum_mutex.go, quorum_rwmutex.go), which runs the ordinary scripts of
// each member in parallel: a lock is granted when a majority granted it
// within its validity, and every failed attempt is undone on the members
// (an RWMutex call that waits keeps its waiting places on the members that
// refused it until the call ends). Each member keeps its own lease of the
// hold alive through its own renewer; the hold's Lease (quorum_lease.go) is
// lost as soon as fewer than a majority of those leases are alive. Waiting
// uses the members' notifications.
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

// splitBackoff bounds the random part of the pause after an attempt that
// took some but too few masters, so that contenders that split the masters
// do not retry in lockstep.
const splitBackoff = 5 * time.Millisecond

// A memberUndo undoes on member i whatever the attempts of a quorum call
// under id did there (see quorumCall.undo), as a failed call's clean-up
// (see Client.cleanup); done, if set, is closed once it is over.
type memberUndo struct {
	k    *quorumCall
	i    int
	id   string
	done chan struct{}
}

func (u memberUndo) abandon(ctx context.Context) {
	if u.done != nil {
		defer close(u.done)
	}
	u.k.undo(ctx, u.i, u.id)
}

// stragglerWait is how long a quorum attempt whose outcome is decided
// waits at least for the replies of the other masters (see poll): long
// enough for a loaded machine, so that a hold is kept on every master that
// answers in time (a Lease is lost when fewer than a majority keep it),
// short against a lease.
const stragglerWait = 200 * time.Millisecond

// errBusy is the answer of a member that a call does not ask (see poll).
var errBusy = errors.New("dsync: master still busy with an earlier attempt")

// poll makes one attempt of a call on every member, in parallel, with try,
// and collects the replies as each does; a member whose busy channel is
// open (the undo of the call's earlier attempt there still runs) is not
// asked, and answers errBusy. As soon as the replies decide the outcome
// (need grants, or too many refusals for that), it waits for the others as
// long again as that took, stragglerWait at least, and then gives up on them, as
// Redlock does on a slow master: their attempts end (see Client.within)
// and count as lost replies, which the caller undoes.
func (q *Quorum) poll(ctx context.Context, busy []chan struct{}, try func(ctx context.Context, i int) (int64, error)) answers {
	n := len(q.members)
	a := answers{v: make([]int64, n), err: make([]error, n)}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type reply struct {
		i   int
		v   int64
		err error
	}
	replies := make(chan reply, n)
	asked := 0
	for i := range n {
		if busy[i] != nil {
			select {
			case <-busy[i]:
				busy[i] = nil
			default:
				a.err[i] = errBusy
				continue
			}
		}
		asked++
		go func() {
			v, err := try(pctx, i)
			replies <- reply{i, v, err}
		}()
	}
	start := time.Now()
	var late <-chan time.Time
	grants, refusals := 0, 0
	for range asked {
		var r reply
		select {
		case r = <-replies:
		case <-late:
			cancel()
			r = <-replies
		}
		a.v[r.i], a.err[r.i] = r.v, r.err
		switch {
		case r.err != nil:
		case r.v > 0:
			grants++
		default:
			refusals++
		}
		if late == nil && (grants >= q.need || refusals > n-q.need) {
			t := time.NewTimer(max(time.Since(start), stragglerWait))
			defer t.Stop()
			late = t.C
		}
	}
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

// A Quorum makes Mutexes and RWMutexes that hold only when a majority of
// independent Redis masters grant the hold (the Redlock algorithm), so that
// no single master decides alone. Get one with [NewQuorum]. The handles it
// makes are the same types as a [Client]'s and behave the same way, but for
// what the quorum changes (see NewQuorum). A Quorum has no Semaphore and no
// Once: their permits and done marks have no Redlock counterpart whose
// safety is shown. A Quorum is safe for concurrent use.
type Quorum struct {
	base // defaults, bad input, closed state, owners' holds (see lease.go)

	members []*Client
	need    int // N/2+1
	once    sync.Once

	watchMu sync.Mutex     // orders watch against Close
	watched sync.WaitGroup // watchers of quorum holds (see watch)
}

// NewQuorum returns a Quorum whose Mutexes and RWMutexes use the Redlock
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
// an RWMutex's writer preference as a single one does. See the package
// documentation's scaling notes for fencing tokens.
//
// Options are as for [New], but for [WaitReplicas], which a Quorum refuses.
// No clients, a nil client or a bad option makes every call fail with
// [ErrInvalid]. Close stops the Quorum and its members; it does not close
// the Redis clients.
func NewQuorum(clients []redis.UniversalClient, opts ...Option) *Quorum {
	q := &Quorum{}
	q.init(opts)
	switch {
	case q.err != nil:
	case len(clients) == 0:
		q.err = fmt.Errorf("%w: NewQuorum without clients", ErrInvalid)
	case q.cfg.replicas > 0:
		q.err = errQuorumReplicas
	}
	for i, rdb := range clients {
		if rdb == nil && q.err == nil {
			q.err = fmt.Errorf("%w: nil redis client %d of %d", ErrInvalid, i, len(clients))
		}
	}
	if q.err != nil {
		return q
	}
	q.need = len(clients)/2 + 1
	for _, rdb := range clients {
		q.members = append(q.members, New(rdb, opts...))
	}
	return q
}

var errQuorumReplicas = fmt.Errorf("%w: WaitReplicas in quorum mode", ErrInvalid)

// Close stops the Quorum: the Leases of its holds end (their Done channels
// close), its members stop renewing and notifying, and calls in progress
// and later calls return [ErrClosed]. Holds are not released: they expire
// at their TTL. Close does not close the Redis clients. It is safe to call
// more than once.
func (q *Quorum) Close() error {
	q.once.Do(func() {
		q.watchMu.Lock()
		close(q.closed)
		q.watchMu.Unlock()
		q.watched.Wait()
		q.releases.close(releaseTimeout)
		for _, m := range q.members {
			m.Close()
		}
	})
	return nil
}

// shared returns what q shares with the handles it makes, nil for a nil q.
func (q *Quorum) shared() *base {
	if q == nil {
		return nil
	}
	return &q.base
}

// handleErr is the bad-input error of a quorum handle with cfg whose
// error is otherwise err: a handle's WaitReplicas is refused, as NewQuorum's.
func handleErr(cfg *config, err error) error {
	if err == nil && cfg.replicas > 0 {
		return errQuorumReplicas
	}
	return err
}

// members makes one member impl per master with mk.
func members[T any](q *Quorum, mk func(c *Client) T) []T {
	if q == nil {
		return nil
	}
	subs := make([]T, len(q.members))
	for i, c := range q.members {
		subs[i] = mk(c)
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

// vote is what one member's reply to an attempt counts for in the Redlock
// loop (see quorumCall.try): v for a grant, minus the ms to wait at most
// for a refusal, 0 and the reason for a final refusal.
func vote(g grant, err error, v int64) (int64, error) {
	switch {
	case err != nil:
		return 0, err
	case g.kind == taken || g.kind == handed:
		return v, nil
	case g.kind == final:
		return 0, g.err
	}
	return -max(g.wait.Milliseconds(), 1), nil
}

// A quorumCall is one lock call of a primitive in quorum mode, as the
// Redlock loop (Quorum.lock) sees it.
type quorumCall struct {
	channel string // the name's notification channel on every master
	ttl     time.Duration
	// try makes one attempt on member i under call id id: > 0 a grant,
	// < 0 minus the ms to wait at most, 0 as below.
	try func(ctx context.Context, i int, id string) (int64, error)
	// undo undoes on member i whatever the attempts under id did; ctx is
	// detached from the call's.
	undo func(ctx context.Context, i int, id string)
	// zero, if set, is what a reply of 0 from any member ends the call
	// with (RWMutex: ErrUpgrade); otherwise 0 is a refusal.
	zero error
	// keep: a member that refused a waiting call keeps the caller's
	// waiting place, and the call keeps its call id there, until the call
	// ends (RWMutex: a waiting writer holds back new readers, a waiting
	// reader is granted by a writer's Unlock).
	keep bool
	// accept, if set, records a grant; an error from it (errRegrant)
	// undoes the call on every member, and the call returns it.
	accept func(a answers, start time.Time) error
}

// lock runs the Redlock loop of one call: every attempt on all members in
// parallel, granted when a majority granted it within its validity, undone
// otherwise. On a grant it returns the replies and a time no later than the
// start of every granting member's lease.
func (q *Quorum) lock(ctx context.Context, k *quorumCall, wait bool) (answers, time.Time, error) {
	n := len(q.members)
	ids := make([]string, n)      // each member's call id; "" once undone
	since := make([]time.Time, n) // no later than a grant under ids[i] began
	// The members whose last attempt got no reply, and those where its
	// undo still runs in the background (see poll).
	lost := make([]bool, n)
	busy := make([]chan struct{}, n)
	// undo undoes the attempts on the members which selects, in
	// parallel, each as a failed call's clean-up on its member: on a
	// member that answered, waited for while ctx lasts, then left to the
	// member Client's background; on one that did not answer, a slow or
	// paused master, left to the background at once, and the member is not
	// asked again before it is over. So the call returns in time also when
	// a master is slow, and an undo never overtakes a later attempt.
	undo := func(which func(i int) bool) {
		var us []memberUndo
		for i := range ids {
			if ids[i] != "" && which(i) {
				u := memberUndo{k: k, i: i, id: ids[i]}
				if lost[i] {
					u.done = make(chan struct{})
					busy[i] = u.done
				}
				us = append(us, u)
				ids[i] = ""
			}
		}
		each(us, func(_ int, u memberUndo) (int64, error) {
			uctx := ctx
			if u.done != nil {
				c, cancel := context.WithCancel(ctx)
				cancel()
				uctx = c
			}
			q.members[u.i].cleanup(uctx, u)
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
	// Attempts are minRetry apart at least, whatever the masters reply or
	// anyone publishes, but for the first one a notification asks for,
	// which is made at once (as the engine's waiters do).
	prompt := true
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
		a := q.poll(ctx, busy, func(ctx context.Context, i int) (int64, error) { return k.try(ctx, i, ids[i]) })
		for i, err := range a.err {
			lost[i] = err != nil
			if errors.Is(err, errBusy) {
				ids[i], lost[i] = "", false // not sent: nothing to undo
			}
		}
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
			if k.accept != nil {
				if err := k.accept(a, first); err != nil {
					undo(all)
					return answers{}, first, err
				}
			}
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
			d = min(d, minRetry+time.Duration(rand.Int64N(int64(splitBackoff))))
		}
		d = max(d, minRetry)
		if t == nil {
			t = time.NewTimer(d)
			defer t.Stop()
		} else {
			t.Reset(d)
		}
		woken, err := sleep(ctx, q.closed, ws, t)
		if err == nil && woken && !prompt {
			if r := minRetry - time.Since(start); r > 0 {
				t.Reset(r)
				_, err = sleep(ctx, q.closed, nil, t)
			}
		}
		if err != nil {
			undo(all) // the waiting places kept
			return answers{}, first, err
		}
		prompt = prompt && !woken
	}
}

// sleep waits for the timer, a notification on any member (woken), ctx or
// Close.
func sleep(ctx context.Context, closed chan struct{}, ws []*watcher, t *time.Timer) (woken bool, err error) {
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
		return false, ctx.Err()
	case 1:
		return false, ErrClosed
	case 2:
		return false, nil
	}
	return true, nil
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
