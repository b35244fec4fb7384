// Package renew keeps leases alive: one Renewer per dsync.Client extends every
// hold it is given, batching all holds that fall due into pipelined round
// trips, and tells a holder when its hold is gone.
//
// A Renewer runs two goroutines for all its holds: a scheduler and a
// sender. The holds wait in a min-heap ordered by the time they next need
// attention; a single timer wakes the scheduler for the earliest. Holds that fall due within a short
// coalescing window of each other are renewed together, in pipelines of at
// most BatchSize commands, so N holds cost about N/BatchSize round trips per
// interval rather than N.
//
// A hold ends in one of four ways, and Done is closed in each:
//
//   - the holder calls Hold.Release (Err stays nil);
//   - the holder calls Hold.MarkLost, or a renewal replies 0, or renewals keep
//     failing until the conservative deadline passes, or a lease that may not
//     be renewed (fixed, or bounded by MaxHold) runs out (Err is the lost
//     error);
//   - the Renewer is closed (Err stays nil: the hold was not lost to Redis,
//     the client shut down and stopped keeping it alive).
//
// The conservative deadline of a hold is the local time of the last
// successful renewal's send (or Spec.Start) plus TTL, minus a drift allowance
// of TTL/100 + 2ms for clock-rate differences between client and server.
// Since the server started the lease no earlier than the local send time, the
// server still holds the lease until at least that moment; loss is declared
// there and not later. The scheduler does no I/O: a hold whose renewal is in
// flight stays in the heap keyed by its conservative deadline, so it is
// reported lost on time even while the sender waits on a slow round trip or
// is stalled. Each round trip is bounded by 5s, by the smallest interval in
// its batch and by the batch's earliest deadline.
//
// A hold is renewed at most once per interval, up to min(50ms, interval/10)
// early so that it shares a round trip with holds due just before it. A
// failed renewal (network error, timeout) is retried after interval/10 (at
// least 10ms) for as long as the hold may still be alive.
package renew

import (
	"container/heap"
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client is the narrow view of Redis the renewer needs. Every
// redis.UniversalClient satisfies it.
type Client interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

var (
	_ Client = (*redis.Client)(nil)
	_ Client = (*redis.ClusterClient)(nil)
	_ Client = redis.UniversalClient(nil)
)

// Spec describes one hold to keep alive.
type Spec struct {
	// Script extends the hold. It is run as Script.EvalSha(ctx, pipe, Keys, Args...)
	// and must reply with integer 1 (extended) or 0 (the hold is gone).
	// It may be nil for a fixed lease (negative Interval), or when Batch
	// is set: a hold renewed alone is then a batch of one.
	Script *redis.Script
	Keys   []string
	Args   []any
	// Batch, if set, renews many holds of this kind in one call: its KEYS
	// are the Keys of each hold in turn, its ARGV their Args in turn (every
	// hold of one Batch script has as many Keys and Args), and it replies
	// with an array of 1 or 0, one per hold, in order. Holds due together
	// share one call per round trip (on Redis Cluster, one per hash slot)
	// instead of one call each.
	Batch *redis.Script
	// TTL is the lease length the acquire (and each renewal) set on the server.
	TTL time.Duration
	// Interval between renewals; 0 means TTL/3. Negative means never renew:
	// the hold simply runs out at TTL (a fixed lease).
	Interval time.Duration
	// MaxHold bounds the total hold time: no renewal is sent that would
	// extend the hold past Start+MaxHold. 0 means no bound.
	MaxHold time.Duration
	// Start is the local time taken just before the acquire was sent; the
	// server's expiry is at least Start+TTL.
	Start time.Time
	// Lost, if set, is told once when the hold is lost (not when it is
	// released or the Renewer closes): its LeaseLost method is called in a
	// goroutine of its own. (An interface rather than a func, so that a
	// pointer to what the caller keeps of the hold serves without
	// allocating a closure.)
	Lost interface{ LeaseLost() }
}

// defaultBatchSize is the default of BatchSize.
const defaultBatchSize = 1000

var errLost = errors.New("renew: lease lost")

type config struct {
	lost  error
	batch int
}

// Option configures a Renewer.
type Option func(*config)

// LostError sets the error Hold.Err reports once a hold is lost. The default
// is an error with the text "renew: lease lost"; nil keeps the default.
func LostError(err error) Option {
	return func(c *config) {
		if err != nil {
			c.lost = err
		}
	}
}

// BatchSize sets the most renewal commands sent in one pipelined round trip.
// The default is 1000; n <= 0 keeps the default.
func BatchSize(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.batch = n
		}
	}
}

// A Renewer keeps holds alive on one Redis client. Its methods are safe for
// concurrent use. New starts its goroutine; Close stops it.
type Renewer struct {
	c     Client
	cfg   config
	epoch time.Time // times below are nanoseconds since epoch, monotonic

	ctx    context.Context // cancelled by Close; parent of every round trip
	cancel context.CancelFunc
	wake   chan struct{}      // capacity 1: "the heap's head may have changed"
	force  chan chan struct{} // renewAllNow requests
	exited chan struct{}      // closed when run returns
	work   chan struct{}      // capacity 1: "the queue has batches"
	sent   chan struct{}      // closed when the sender returns

	mu     sync.Mutex
	holds  holdHeap // live holds, by when; in-flight ones by their deadline
	live   int      // live holds
	closed bool
	armed  int64   // when the scheduler's timer fires (MaxInt64: not armed)
	queue  []batch // batches for the sender

	// Owned by the scheduler.
	parked []*Hold

	cluster bool // batches are grouped by hash slot

	// Used by the sender's round trips.
	loadMu sync.Mutex
	loaded map[*redis.Script]bool // scripts loaded since the last NOSCRIPT

	// stall, when set, is called by the sender before each round trip: a
	// test hook, settable only from tests (see setStall).
	stall atomic.Pointer[func()]
}

// New returns a Renewer that renews through c, and starts its goroutine.
// Call Close to stop it.
func New(c Client, opts ...Option) *Renewer {
	cfg := config{lost: errLost, batch: defaultBatchSize}
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Renewer{
		c:      c,
		cfg:    cfg,
		epoch:  time.Now(),
		ctx:    ctx,
		cancel: cancel,
		wake:   make(chan struct{}, 1),
		force:  make(chan chan struct{}),
		exited: make(chan struct{}),
		work:   make(chan struct{}, 1),
		sent:   make(chan struct{}),
		loaded: make(map[*redis.Script]bool),
		armed:  math.MaxInt64,
	}
	_, r.cluster = c.(*redis.ClusterClient)
	go r.run()
	go r.sender()
	return r
}

// Add starts keeping the hold described by s alive and returns it. Add does
// no I/O, starts no goroutine, and wakes the scheduler only when the hold
// needs attention before its timer fires. The first renewal is due at
// s.Start+Interval; if that has already passed it is sent at once.
//
// A TTL <= 0 gives a hold that is lost at once. Add panics if s.Script and
// s.Batch are nil and s.Interval is not negative. After Close, Add returns
// a hold that has already ended with a nil Err.
func (r *Renewer) Add(s Spec) *Hold {
	h := &Hold{
		r:        r,
		script:   s.Script,
		batch:    s.Batch,
		keys:     s.Keys,
		args:     s.Args,
		ttl:      int64(s.TTL),
		interval: int64(s.Interval),
		limit:    math.MaxInt64,
		index:    -1,
		onLost:   s.Lost,
	}
	switch {
	case s.Interval < 0:
		h.fixed = true
	case s.Script == nil && s.Batch == nil:
		panic("renew: Spec.Script and Spec.Batch are nil for a renewed lease")
	case s.Interval == 0:
		h.interval = int64(s.TTL / 3)
	}
	start := int64(s.Start.Sub(r.epoch))
	if s.MaxHold > 0 {
		h.limit = satAdd(start, int64(s.MaxHold))
	}
	h.deadline = satAdd(start, h.ttl)
	h.when = h.lostAt()
	if !h.fixed {
		h.when = min(h.when, satAdd(start, h.interval))
	}

	r.mu.Lock()
	if r.closed {
		h.state = closed
		r.mu.Unlock()
		return h
	}
	r.live++
	heap.Push(&r.holds, h)
	early := h.when < r.armed
	r.mu.Unlock()
	if early {
		r.poke()
	}
	return h
}

// Close stops renewing every hold, ends them all (their Done channels close,
// their Err stays nil: the holds were not lost to Redis, this client stopped
// keeping them alive, and they run out on the server at their TTL), and waits
// for the Renewer's goroutine to exit. A round trip in flight is cancelled,
// and Close waits for it to return. Close is idempotent.
func (r *Renewer) Close() { r.CloseWithin(0) }

// CloseWithin is Close, but waits at most d (forever if d ≤ 0) for a round
// trip in flight to return: go-redis does not end a read when its ctx is
// cancelled, and a server that holds the round trip would hold Close for
// as long as go-redis's ReadTimeout (or for ever, with none). The round
// trip then ends in the background when go-redis gives up on it, and
// changes nothing the holds report. It reports whether it had returned.
func (r *Renewer) CloseWithin(d time.Duration) bool {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	<-r.exited
	if d <= 0 {
		<-r.sent
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.sent:
		return true
	case <-t.C:
		return false
	}
}

// Len returns the number of live holds.
func (r *Renewer) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.live
}

// now returns the monotonic time since r.epoch.
func (r *Renewer) now() int64 { return int64(time.Since(r.epoch)) }

// poke wakes the goroutine without blocking.
func (r *Renewer) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// satAdd returns a+b (b >= 0), saturating at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
