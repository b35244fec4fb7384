package dsync

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Script calls of one Client are coalesced: while maxFlight calls (or
// batches of calls) are in flight, later calls wait in a queue, and the
// first call in flight to return sends the whole queue as one pipeline, one
// round trip and one socket write and read for the server however many calls
// it holds. A call made while fewer are in flight goes out at once, alone,
// so that an uncontended call costs what it did. Every call of a batch
// still carries its own call id and is one script, so a batch changes
// nothing a call guarantees: a retry of the pipeline (go-redis re-sends it
// after a read timeout) is a repeat of each of its calls, and a caller
// whose ctx ends while its call is queued or in flight returns then, its
// outcome unknown as after a lost reply. On a cluster, go-redis splits a
// batch into one pipeline per master.
const maxFlight = 1

// maxQueueWait bounds how long a call waits in the queue for a call in
// flight to return: past it the queue goes out on its own (one more in
// flight), so a call the server or the network holds (a stalled
// connection, read until go-redis's ReadTimeout) does not hold up the
// Client's other calls.
const maxQueueWait = time.Millisecond

// A batcher queues the script calls of a Client that come while maxFlight
// are in flight (see maxFlight).
type batcher struct {
	mu     sync.Mutex
	max    int           // calls or batches in flight before calls queue
	wait   time.Duration // maxQueueWait
	flight int
	queue  []*queuedCall
	spare  []*queuedCall // a sent batch's slice, for the next queue
	late   *time.Timer   // sends the queue after maxQueueWait (see flushLate)
}

// A queuedCall is a script call waiting in a batcher's queue, then in a
// batch in flight. Its done channel has room for the one value sent when
// the call is over (see over), so that the call and its channel are used
// again (see queuedCalls) once the caller received it; a call whose caller
// gave up on it is left to the garbage collector.
type queuedCall struct {
	ctx  context.Context
	sc   *script
	a    []any       // the command (see scriptCall)
	cmd  *redis.Cmd  // its reply, once over; nil if its caller was gone
	gone atomic.Bool // its caller returned (ctx ended): not sent if not yet
	done chan struct{}
}

// queuedCalls holds queuedCalls that are over, ready to be used again.
var queuedCalls = sync.Pool{New: func() any { return &queuedCall{done: make(chan struct{}, 1)} }}

// over tells q's caller that q is over; q is the caller's from here on.
func (q *queuedCall) over() { q.done <- struct{}{} }

// reuse returns q's reply and keeps q for another call; q is over (or
// was never queued) and its caller received from done.
func (q *queuedCall) reuse() *redis.Cmd {
	cmd := q.cmd
	q.ctx, q.sc, q.a, q.cmd = nil, nil, nil, nil
	q.gone.Store(false)
	queuedCalls.Put(q)
	return cmd
}

// enter reports whether a call of c may go out at once (counted in flight,
// to be ended by leave); if not, q (if not nil) joins the queue.
func (c *Client) enter(q *queuedCall) bool {
	b := &c.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.flight < b.max && len(b.queue) == 0 {
		b.flight++
		return true
	}
	if q == nil {
		return false
	}
	if b.queue == nil {
		b.queue, b.spare = b.spare, nil
	}
	b.queue = append(b.queue, q)
	if len(b.queue) == 1 {
		if b.late == nil {
			b.late = time.AfterFunc(b.wait, c.flushLate)
		} else {
			b.late.Reset(b.wait)
		}
	}
	return false
}

// leave ends a call or batch in flight: the queue, if any, goes out in its
// place (see sendBatch).
func (c *Client) leave() { c.flush(-1) }

// flushLate sends the queue that waited maxQueueWait for a call in flight
// to return, as one more in flight.
func (c *Client) flushLate() { c.flush(+1) }

// flush sends the queue, if any. For leave (d = -1) a call or batch in
// flight has ended: the queue takes its place, or the count drops by one.
// For flushLate (d = +1) the queue goes out as one more in flight.
func (c *Client) flush(d int) {
	b := &c.batch
	b.mu.Lock()
	batch := b.queue
	switch {
	case len(batch) == 0:
		b.flight += min(d, 0)
	case d < 0:
		b.late.Stop() // the batch goes in the place of the call that ended
	default:
		b.flight += d
	}
	b.queue = nil
	b.mu.Unlock()
	if len(batch) > 0 {
		c.startBatch(batch)
	}
}

// startBatch sends batch in a goroutine of its own, owned by c; once c is
// closed, in one of its own (the calls in it are calls in progress at
// Close, or the clean-ups of such calls, which still go out).
func (c *Client) startBatch(batch []*queuedCall) {
	go c.sendBatch(batch, c.calls.add())
}

// recycle keeps the slice of a batch that was sent for the next queue.
func (b *batcher) recycle(batch []*queuedCall) {
	clear(batch)
	b.mu.Lock()
	b.spare = batch[:0]
	b.mu.Unlock()
}

// evalQueued sends a call to the queue (see maxFlight), or at once if the
// calls in flight ended meanwhile, and waits for its reply or for ctx's end.
func (c *Client) evalQueued(ctx context.Context, sc *script, a []any) *redis.Cmd {
	q := queuedCalls.Get().(*queuedCall)
	q.ctx, q.sc, q.a = ctx, sc, a
	if c.enter(q) {
		q.reuse()
		return c.evalAlone(ctx, sc, a)
	}
	if ctx.Done() == nil {
		<-q.done
		return q.reuse()
	}
	if !awaitCall(ctx, q.done) {
		// q goes on without its caller; it is not used again.
		q.gone.Store(true)
		cmd := redis.NewCmd(ctx, a...)
		cmd.SetErr(ctx.Err())
		return cmd
	}
	return q.reuse()
}

// sendBatch sends batch, calls taken from the queue, as one pipeline (one
// call alone, as if it had not waited), and then ends its flight (see
// leave); counted tells that c.calls counts the goroutine it runs in. A
// call whose caller returned meanwhile is not sent; a call the server did
// not know the script of is sent again alone, after loading it.
func (c *Client) sendBatch(batch []*queuedCall, counted bool) {
	if counted {
		defer c.calls.end()
	}
	defer c.leave()
	defer c.batch.recycle(batch)
	sent := batch[:0]
	for _, q := range batch {
		if q.gone.Load() {
			q.over()
			continue
		}
		sent = append(sent, q)
	}
	switch len(sent) {
	case 0:
		return
	case 1:
		q := sent[0]
		q.cmd = c.evalNow(q.ctx, q.sc, q.a)
		q.over()
		return
	}
	// Calls of several callers go on a ctx of none of them: a caller whose
	// ctx ends returns at once (see evalQueued), and hooks see none's
	// values.
	pipe := c.rdb.Pipeline()
	for _, q := range sent {
		q.cmd = redis.NewCmd(q.ctx, q.a...)
		_ = pipe.Process(q.ctx, q.cmd)
	}
	_, _ = pipe.Exec(context.Background())
	for _, q := range sent {
		err := q.cmd.Err()
		switch {
		case err != nil && redis.HasErrorPrefix(err, "NOSCRIPT"):
			q.cmd = c.evalNow(q.ctx, q.sc, q.a)
		case err != nil:
			q.cmd.SetErr(scriptError(err))
		}
		q.over()
	}
}
