package dsync

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Quorum mode (Redlock) is a layer over the engine of one deployment. A
// Quorum holds one member Client per independent master; its Mutex and
// RWMutex handles are the handles of one deployment with another impl
// (quorum_mutex.go, quorum_rwmutex.go, both a quorumLock: quorum_lock.go),
// which runs the ordinary scripts of each member in parallel (the Redlock
// loop, quorum_redlock.go): a lock is granted when a majority granted it
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

// A Quorum makes Mutexes and RWMutexes that hold only when a majority of
// independent Redis masters grant the hold (the Redlock algorithm), so that
// no single master decides alone. Get one with [NewQuorum]. The handles it
// makes are the same types as a [Client]'s and behave the same way, but for
// what the quorum changes (see NewQuorum). A Quorum has no Semaphore and no
// Once: their permits and done marks have no Redlock counterpart whose
// safety is shown. A Quorum is safe for concurrent use.
type Quorum struct {
	base // defaults, bad input, closed state, owners' holds (see base.go)

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
// attempt costs one round trip to every master, in parallel; once a
// majority decided it, a master slower than the others by more than 200 ms
// is given up on for that attempt (the attempt is undone there in the
// background), so that one slow master does not slow every call. Waiting,
// ownership and reentrancy are as on a single master, and each master keeps
// an RWMutex's writer preference as a single one does. See the package
// documentation's scaling notes for fencing tokens.
//
// Options are as for [New], but for [WaitReplicas], which a Quorum refuses,
// and a [TTL] below 5 ms, which it refuses too: Redlock's validity leaves
// nothing of it.
// No clients, a nil or ring client or a bad option makes every call fail
// with [ErrInvalid]. Close stops the Quorum and its members; it does not close
// the Redis clients.
func NewQuorum(clients []redis.UniversalClient, opts ...Option) *Quorum {
	q := &Quorum{}
	q.init(opts)
	switch {
	case q.err != nil:
	case len(clients) == 0:
		q.err = fmt.Errorf("%w: NewQuorum without clients", ErrInvalid)
	default:
		q.err = handleErr(&q.cfg, nil)
	}
	for i, rdb := range clients {
		if rdb == nil && q.err == nil {
			q.err = fmt.Errorf("%w: nil redis client %d of %d", ErrInvalid, i, len(clients))
		}
		if _, ring := rdb.(*redis.Ring); ring && q.err == nil {
			q.err = fmt.Errorf("%w: redis client %d of %d is a ring client (see New)", ErrInvalid, i, len(clients))
		}
	}
	if q.err != nil {
		return q
	}
	q.need = len(clients)/2 + 1
	for i, rdb := range clients {
		c := New(rdb, opts...)
		c.quorum, c.member = q, i
		q.members = append(q.members, c)
	}
	return q
}

// memberEnded notes that an unlock of the owner whose holder token is tok,
// naming no hold (the owner had none on record when it was sent), ended on
// master i the hold with fencing token (or read hold id) fence of the
// lock whose holds are recorded under key. If that is the member hold
// there of the quorum hold the owner has on record (a Lock of the owner
// recorded it meanwhile: its reply came before the unlock's), the member
// hold is over, and once fewer than a majority of them live, the quorum
// hold's lease is lost (see watch), rather than reported live while
// another owner may hold the name. (Where the unlock's reply comes first,
// the member Client tells the Lock in flight instead: see
// quorumLock.lock.)
func (q *Quorum) memberEnded(i int, cfg *config, key, tok string, fence uint64) {
	h := q.lookupHold(holdKey{key, q.ownerOf(cfg, tok)})
	if m := memberHold(h, i); m != nil && m.fence == fence && !m.lost() {
		m.lease.MarkLost()
	}
}

var errQuorumReplicas = fmt.Errorf("%w: WaitReplicas in quorum mode", ErrInvalid)

// Close stops the Quorum: the Leases of its holds end (their Done channels
// close), its members stop renewing and notifying, and calls in progress
// and later calls return [ErrClosed]. Holds are not released: they expire
// at their TTL. Close does not close the Redis clients. It is safe to call
// more than once.
// Close of a nil Quorum, or of one not made by NewQuorum, stops nothing and
// returns an error for which errors.Is(err, [ErrInvalid]) holds, as its
// calls do.
func (q *Quorum) Close() error {
	if b := q.shared(); b == nil || b.closed == nil {
		// Nothing to stop: a nil or zero Quorum, as every call reports.
		return b.check()
	}
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

// minQuorumTTL is the shortest TTL in quorum mode: Redlock's validity,
// TTL − elapsed − drift (drift = TTL/100 + 2 ms), leaves a shorter one
// about nothing, so that a free name would never be granted.
const minQuorumTTL = 5 * time.Millisecond

// handleErr is the bad-input error of a Quorum, or of a quorum handle, with
// cfg whose error is otherwise err: WaitReplicas is refused, and a TTL
// below minQuorumTTL.
func handleErr(cfg *config, err error) error {
	switch {
	case err != nil:
		return err
	case cfg.replicas > 0:
		return errQuorumReplicas
	case cfg.ttl < minQuorumTTL:
		return fmt.Errorf("%w: TTL %v in quorum mode, want at least %v (Redlock's validity, TTL − elapsed − TTL/100 − 2ms, leaves a shorter one no time)", ErrInvalid, cfg.ttl, minQuorumTTL)
	}
	return nil
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
	a.tally()
	return a
}

// tally counts the members that answered and granted, and the largest grant.
func (a *answers) tally() {
	for i, err := range a.err {
		if err != nil {
			continue
		}
		a.got++
		if a.v[i] > 0 {
			a.hits++
			a.max = max(a.max, a.v[i])
		}
	}
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
