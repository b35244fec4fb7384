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
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/internal/faults"
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
	// It may be nil only for a fixed lease (negative Interval).
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
}

const (
	defaultBatchSize = 1000
	// maxCoalesce bounds how early a hold may be renewed so that it shares a
	// round trip with holds due slightly before it; a hold's own window is
	// the smaller of this and a tenth of its interval.
	maxCoalesce = 50 * time.Millisecond
	// maxRoundTrip bounds each round trip; it is also bounded by the
	// smallest interval in the batch and by the batch's earliest
	// conservative deadline.
	maxRoundTrip = 5 * time.Second
	// maxInFlight bounds the round trips the sender has in flight at once.
	maxInFlight = 4
	// minBackoff is the least wait before retrying a failed renewal; the
	// usual wait is a tenth of the interval.
	minBackoff = 10 * time.Millisecond
)

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
}

// A batch is the holds of one round trip, or a marker whose done channel
// the sender closes when it reaches it.
type batch struct {
	hs   []*Hold
	done chan struct{}
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
// A TTL <= 0 gives a hold that is lost at once. Add panics if s.Script is nil
// and s.Interval is not negative. After Close, Add returns a hold that has
// already ended with a nil Err.
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
	}
	switch {
	case s.Interval < 0:
		h.fixed = true
	case s.Script == nil:
		panic("renew: Spec.Script is nil for a renewed lease")
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
// for the Renewer's goroutine to exit. A round trip in flight is cancelled.
// Close is idempotent.
func (r *Renewer) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	<-r.exited
	<-r.sent
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

// renewAllNow makes every renewable hold due, runs one pass over them on the
// Renewer's goroutine — the same code path as a timer tick — and returns when
// that pass is done. Used by benchmarks.
func (r *Renewer) renewAllNow() {
	reply := make(chan struct{})
	select {
	case r.force <- reply:
		<-reply
	case <-r.exited:
	}
}

func (r *Renewer) run() {
	defer close(r.exited)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var forced chan struct{}
	for {
		r.pass(forced)
		forced = nil
		if r.ctx.Err() != nil {
			break
		}
		var tick <-chan time.Time
		if wait, ok := r.untilNext(); ok {
			timer.Reset(time.Duration(wait))
			tick = timer.C
		}
		// A hold added after untilNext with an earlier time pokes wake.
		select {
		case <-tick:
		case <-r.wake:
		case forced = <-r.force:
			r.makeAllDue()
			// The sender closes forced once it has sent this pass.
		case <-r.ctx.Done():
		}
		timer.Stop()
	}
	r.shutdown()
}

// untilNext reports how long until the heap's head needs attention, and
// whether there is a head at all.
func (r *Renewer) untilNext() (int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.holds) == 0 {
		r.armed = math.MaxInt64
		return 0, false
	}
	r.armed = r.holds[0].when
	return max(r.holds[0].when-r.now(), 0), true
}

func (r *Renewer) makeAllDue() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	for _, h := range r.holds {
		if !h.fixed && !h.inflight {
			h.when = min(h.when, now)
		}
	}
	heap.Init(&r.holds)
}

// shutdown ends every hold left after the goroutine stopped.
func (r *Renewer) shutdown() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.holds) > 0 {
		r.holds[len(r.holds)-1].endLocked(closed)
	}
}

// pass takes every hold that needs attention now — losing those whose
// conservative deadline has passed (in flight or not), parking those that may
// not be renewed until they run out — and queues the rest for the sender in
// batches. Queued holds stay in the heap, keyed by their deadline.
func (r *Renewer) pass(marker chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	parked := r.parked[:0]
	var due []*Hold
	for len(r.holds) > 0 {
		h := r.holds[0]
		if h.when > now+int64(maxCoalesce) {
			break
		}
		heap.Pop(&r.holds)
		switch {
		case now >= h.lostAt():
			h.endLocked(lost)
		case h.inflight:
			parked = append(parked, h) // its deadline is not here yet
		case !h.mayRenew(now):
			// Fixed, or bounded by MaxHold: it runs out at its deadline.
			h.fixed = true
			h.when = h.lostAt()
			parked = append(parked, h)
		case h.when > now+h.window():
			parked = append(parked, h) // not yet, not even coalesced
		default:
			h.inflight = true
			h.when = h.lostAt()
			parked = append(parked, h)
			due = append(due, h)
		}
	}
	for _, h := range parked {
		heap.Push(&r.holds, h)
	}
	clear(parked)
	r.parked = parked[:0]

	for len(due) > 0 {
		n := min(len(due), r.cfg.batch)
		r.queue = append(r.queue, batch{hs: due[:n:n]})
		due = due[n:]
	}
	if marker != nil {
		r.queue = append(r.queue, batch{done: marker})
	}
	if len(r.queue) > 0 {
		select {
		case r.work <- struct{}{}:
		default:
		}
	}
}

// sender sends the queued batches, one round trip at a time, until Close.
func (r *Renewer) sender() {
	defer close(r.sent)
	for {
		select {
		case <-r.work:
		case <-r.ctx.Done():
			r.mu.Lock()
			for _, b := range r.queue {
				if b.done != nil {
					close(b.done)
				}
			}
			r.queue = nil
			r.mu.Unlock()
			return
		}
		for {
			// Up to maxInFlight round trips at once, each on its own
			// connection, so that encoding one overlaps the server's work
			// on another. A marker waits for the batches before it.
			r.mu.Lock()
			var bs []batch
			for len(r.queue) > 0 && len(bs) < maxInFlight {
				b := r.queue[0]
				if b.done != nil && len(bs) > 0 {
					break
				}
				r.queue[0] = batch{}
				r.queue = r.queue[1:]
				bs = append(bs, b)
				if b.done != nil {
					break
				}
			}
			r.mu.Unlock()
			if len(bs) == 0 {
				break
			}
			if bs[0].done != nil {
				close(bs[0].done)
				continue
			}
			if len(bs) == 1 {
				r.send(bs[0].hs)
				continue
			}
			var wg sync.WaitGroup
			for _, b := range bs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r.send(b.hs)
				}()
			}
			wg.Wait()
		}
	}
}

// result is the outcome of one renewal command.
type result struct {
	sent int64 // local time just before its pipeline was sent
	err  error
	val  int64
}

// send renews hs (at most BatchSize holds, none in the heap) in one pipelined
// round trip, plus one more if the server lacked a script, and files each
// hold back into the heap or ends it.
func (r *Renewer) send(hs []*Hold) {
	if f := faults.RenewStall.Load(); f != nil {
		(*f)()
	}

	// Re-check after a possible stall: a hold whose conservative deadline
	// passed meanwhile is lost, even if a renewal would still find the key.
	r.mu.Lock()
	now := r.now()
	if r.ctx.Err() != nil {
		r.mu.Unlock()
		return // the holds are in the heap; shutdown ends them
	}
	timeout := int64(maxRoundTrip)
	keep := hs[:0]
	for _, h := range hs {
		switch {
		case h.state != live:
		case now >= h.lostAt():
			h.endLocked(lost)
		case !h.mayRenew(now):
			// MaxHold was reached while waiting: let it run out (it is in
			// the heap already, keyed by its deadline).
			h.fixed = true
			h.inflight = false
		default:
			// No reply after the conservative deadline can save the hold,
			// so waiting longer than that for it is pointless.
			timeout = min(timeout, h.interval, h.lostAt()-now)
			keep = append(keep, h)
		}
	}
	hs = keep
	r.mu.Unlock()
	if len(hs) == 0 {
		return
	}

	ctx, cancel := context.WithTimeout(r.ctx, time.Duration(max(timeout, int64(time.Millisecond))))
	defer cancel()
	res := make([]result, len(hs))
	if err := r.load(ctx, hs, nil); err != nil {
		for i := range res {
			res[i].err = err
		}
	} else {
		all := make([]int, len(hs))
		for i := range all {
			all[i] = i
		}
		r.exec(ctx, hs, all, res)
		// A pipeline gets no EVAL fallback: load what the server lacked and
		// redo those commands once.
		var redo []int
		for i := range res {
			if redis.HasErrorPrefix(res[i].err, "NOSCRIPT") {
				redo = append(redo, i)
			}
		}
		if len(redo) > 0 {
			if err := r.load(ctx, hs, redo); err != nil {
				for _, i := range redo {
					res[i].err = err
				}
			} else {
				r.exec(ctx, hs, redo, res)
			}
		}
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	now = r.now()
	closing := r.ctx.Err() != nil
	early := false
	defer func() {
		if early {
			r.poke()
		}
	}()
	for i, h := range hs {
		if h.state != live {
			continue // released, marked lost or run out while in flight
		}
		rs := res[i]
		switch {
		case rs.err == nil && rs.val == 0:
			h.endLocked(lost)
			continue
		case closing:
			// The failure is ours, not Redis's; shutdown ends the hold.
			continue
		case now >= h.lostAt():
			// Whatever the reply, it came after the conservative deadline,
			// when the holder may already have been given up on.
			h.endLocked(lost)
			continue
		case rs.err == nil && rs.val == 1:
			h.deadline = rs.sent + h.ttl
			h.when = min(rs.sent+h.interval, h.lostAt())
		default:
			// Network error, timeout, or a reply the script should not
			// give: retry soon while the hold may still be alive.
			h.when = min(now+max(h.interval/10, int64(minBackoff)), h.lostAt())
		}
		h.inflight = false
		heap.Fix(&r.holds, int(h.index))
		early = early || h.when < r.armed
	}
}

// load loads the scripts of hs[idx] (of all hs if idx is nil) that are not
// known to be loaded — or, when idx is given, all of them, since the server
// just said it lacks them.
func (r *Renewer) load(ctx context.Context, hs []*Hold, idx []int) error {
	r.loadMu.Lock()
	defer r.loadMu.Unlock()
	var scripts []*redis.Script
	add := func(s *redis.Script) {
		if (idx == nil && r.loaded[s]) || contains(scripts, s) {
			return
		}
		scripts = append(scripts, s)
	}
	addHold := func(h *Hold) {
		if h.batch != nil {
			add(h.batch)
		} else {
			add(h.script)
		}
	}
	if idx == nil {
		for _, h := range hs {
			addHold(h)
		}
	} else {
		for _, i := range idx {
			addHold(hs[i])
		}
	}
	for _, s := range scripts {
		delete(r.loaded, s)
		if err := s.Load(ctx, r.c).Err(); err != nil {
			return err
		}
		r.loaded[s] = true
	}
	return nil
}

func contains(ss []*redis.Script, s *redis.Script) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// exec sends the renewals of hs[idx] in one pipeline and stores their
// outcomes in res[idx]. Holds with a Batch script share one command per
// script (and, on a cluster, per hash slot).
func (r *Renewer) exec(ctx context.Context, hs []*Hold, idx []int, res []result) {
	pipe := r.c.Pipeline()
	type group struct {
		cmd  *redis.Cmd
		idx  []int // into hs, in the order of the batch's replies
		args []any
	}
	type groupKey struct {
		s    *redis.Script
		slot int
	}
	var groups map[groupKey]*group
	var order []*group
	cmds := make([]*redis.Cmd, len(idx))
	for j, i := range idx {
		h := hs[i]
		if h.batch != nil {
			k := groupKey{h.batch, -1}
			if r.cluster {
				k.slot = slot(h.keys[0])
			}
			if groups == nil {
				groups = make(map[groupKey]*group)
			}
			g := groups[k]
			if g == nil {
				g = &group{}
				groups[k] = g
				order = append(order, g)
			}
			g.idx = append(g.idx, i)
			continue
		}
		if h.cmd == nil {
			// Built once, at the first renewal: most holds end before it.
			h.cmd = make([]any, 0, 3+len(h.keys)+len(h.args))
			h.cmd = append(h.cmd, "evalsha", h.script.Hash(), len(h.keys))
			for _, k := range h.keys {
				h.cmd = append(h.cmd, k)
			}
			h.cmd = append(h.cmd, h.args...)
		}
		cmds[j] = redis.NewCmd(ctx, h.cmd...)
		_ = pipe.Process(ctx, cmds[j])
	}
	for _, g := range order {
		first := hs[g.idx[0]]
		nk, na := len(first.keys), len(first.args)
		a := make([]any, 0, 3+len(g.idx)*(nk+na))
		a = append(a, "evalsha", first.batch.Hash(), len(g.idx)*nk)
		for _, i := range g.idx {
			for _, k := range hs[i].keys {
				a = append(a, k)
			}
		}
		for _, i := range g.idx {
			a = append(a, hs[i].args...)
		}
		g.cmd = redis.NewCmd(ctx, a...)
		_ = pipe.Process(ctx, g.cmd)
	}
	sent := r.now()
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for j, i := range idx {
		if cmds[j] == nil {
			continue
		}
		v, err := cmds[j].Int64()
		res[i] = result{sent: sent, err: err, val: v}
	}
	for _, g := range order {
		vs, err := g.cmd.Int64Slice()
		if err == nil && len(vs) != len(g.idx) {
			err = fmt.Errorf("renew: batch replied %d values for %d holds", len(vs), len(g.idx))
		}
		for n, i := range g.idx {
			if err != nil {
				res[i] = result{sent: sent, err: err}
				continue
			}
			res[i] = result{sent: sent, val: vs[n]}
		}
	}
}

// satAdd returns a+b (b >= 0), saturating at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
