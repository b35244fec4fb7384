package dsync

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// tasks counts the goroutines a Client leaves running past the call that
// started them, so that Close can wait for them. Once closed it starts no
// more.
type tasks struct {
	mu     sync.Mutex
	n      int
	closed bool
	zero   chan struct{} // closed when n drops to 0; made by idle
}

// start runs f in a goroutine counted by t; false (and f not run) once t
// is closed.
func (t *tasks) start(f func()) bool {
	if !t.add() {
		return false
	}
	go func() {
		defer t.end()
		f()
	}()
	return true
}

// add counts a goroutine about to start, which calls end when it ends;
// false (and nothing counted) once t is closed.
func (t *tasks) add() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.n++
	return true
}

func (t *tasks) end() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.n == 0 && t.zero != nil {
		close(t.zero)
		t.zero = nil
	}
}

// idle returns a channel closed once no goroutine of t runs (at once if
// none does).
func (t *tasks) idle() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		return closedChan
	}
	if t.zero == nil {
		t.zero = make(chan struct{})
	}
	return t.zero
}

// close stops t from starting more goroutines and waits for those running
// to end, at most d (forever if d ≤ 0). It reports whether they ended.
func (t *tasks) close(d time.Duration) bool {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	idle := t.idle()
	if d <= 0 {
		<-idle
		return true
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-idle:
		return true
	case <-tm.C:
		return false
	}
}

// inflight counts the calls in progress on a Client that may start a
// clean-up (acquisitions, Once runs and resets, releases that pass a hold
// in the process), so that Close can wait for them to return before it
// stops the background: a call that Close ended starts its clean-up in the
// Client's background, where Close waits for it, rather than on its own
// after Close returned. A call costs two atomic adds, a load and a defer.
type inflight struct {
	n      atomic.Int64
	closed atomic.Bool
	once   sync.Once
	zero   chan struct{} // closed once closed and n is 0
}

func newInflight() *inflight { return &inflight{zero: make(chan struct{})} }

// enter counts a call until its exit; false (and nothing counted) once
// closed.
func (f *inflight) enter() bool {
	f.n.Add(1)
	if f.closed.Load() {
		f.exit()
		return false
	}
	return true
}

func (f *inflight) exit() {
	if f.n.Add(-1) == 0 && f.closed.Load() {
		f.once.Do(func() { close(f.zero) })
	}
}

// close stops f from counting more calls and waits for those in progress
// to exit, at most d. It reports whether they did.
func (f *inflight) close(d time.Duration) bool {
	f.closed.Store(true)
	if f.n.Load() == 0 {
		f.once.Do(func() { close(f.zero) })
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-f.zero:
		return true
	case <-t.C:
		return false
	}
}

// begin counts a call of c in progress (see inflight) until c.end; false
// (nothing counted) once c is closed.
func (c *Client) begin() bool { return c.active.enter() }

func (c *Client) end() { c.active.exit() }

// within runs f, which sends commands on ctx, and returns when f returns
// or ctx ends, whichever comes first: false if ctx ended first. f then
// goes on in the background, owned by c, and what it did is unknown to
// the caller, as after a lost reply.
//
// go-redis does not end a command's read when its ctx is cancelled (only
// at a deadline, and only with ContextTimeoutEnabled), so a server that
// holds a command (paused, or a network that drops replies) would hold the
// caller past its ctx without this.
func (c *Client) within(ctx context.Context, f func()) bool {
	if ctx.Done() == nil || ctx.Err() != nil {
		// Nothing can end ctx, or it has ended: go-redis returns at once.
		f()
		return true
	}
	done := make(chan struct{})
	if !c.calls.start(func() {
		defer close(done)
		f()
	}) {
		f()
		return true
	}
	return awaitCall(ctx, done)
}

// awaitCall waits for done (a command that runs on ctx ended) or ctx,
// whichever comes first: false if ctx ended first.
func awaitCall(ctx context.Context, done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	case <-ctx.Done():
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// An evalCall is a script call that runs in a goroutine of its own (see
// within). Its done channel has room for the one value run sends when the
// call is over, so that the call and its channel are used again (see
// evalCalls) once the caller received it; a call whose caller gave up on
// it is left to the garbage collector.
type evalCall struct {
	c    *Client
	ctx  context.Context
	sc   *script
	a    []any
	cmd  *redis.Cmd
	done chan struct{}
}

// evalCalls holds evalCalls that are over, ready to be used again.
var evalCalls = sync.Pool{New: func() any { return &evalCall{done: make(chan struct{}, 1)} }}

func (e *evalCall) run() {
	c := e.c
	defer c.calls.end()
	e.cmd = c.evalNow(e.ctx, e.sc, e.a)
	c.leave()
	e.done <- struct{}{} // e is the caller's from here on
}

// reuse returns e's reply and puts e back for another call; e's run is
// over (the caller received from done).
func (e *evalCall) reuse() *redis.Cmd {
	cmd := e.cmd
	*e = evalCall{done: e.done}
	evalCalls.Put(e)
	return cmd
}
