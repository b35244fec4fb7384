package redistest

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Counter is a go-redis hook that counts round trips: each Process call is
// one and each ProcessPipeline call (a pipeline or a transaction) is one.
// Install it with rdb.AddHook(c), or with [Count], which also counts right
// on a cluster client. The retries go-redis makes inside one call are not
// counted separately. Connection set-up commands (HELLO, AUTH, CLIENT,
// SELECT, READONLY), which go-redis sends through the hooks whenever it
// dials, are not counted, so counts do not depend on how many connections
// the pool opens (go-redis 9.23 keeps a separate pool for pipelines); nor
// are the look-ups a cluster client makes of its own accord (CLUSTER,
// COMMAND). Safe for concurrent use; the zero value is ready to use.
type Counter struct {
	roundTrips atomic.Int64
	dials      atomic.Int64
}

var _ redis.Hook = (*Counter)(nil)

// Count returns a Counter that counts the round trips rdb makes from now
// on. On a *redis.ClusterClient it is installed on each node's client as
// go-redis creates it, so that a command redirected to another node counts
// two and a pipeline that go-redis splits over three masters counts three
// (one per node, sent in parallel), where a hook on the cluster client
// itself would count one call; call Count before rdb's first command, since
// node clients created earlier are not hooked. On any other client it is
// rdb.AddHook.
func Count(rdb redis.UniversalClient) *Counter {
	c := &Counter{}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		cc.OnNewNode(func(node *redis.Client) { node.AddHook(c) })
		return c
	}
	rdb.AddHook(c)
	return c
}

// RoundTrips returns the round trips counted since the last Reset.
func (c *Counter) RoundTrips() int64 { return c.roundTrips.Load() }

// Dials returns the connections dialled since the last Reset.
func (c *Counter) Dials() int64 { return c.dials.Load() }

// Reset sets the counts to zero.
func (c *Counter) Reset() {
	c.roundTrips.Store(0)
	c.dials.Store(0)
}

// DialHook counts dials.
func (c *Counter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.dials.Add(1)
		return next(ctx, network, addr)
	}
}

// ProcessHook counts one round trip per command.
func (c *Counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if counted(cmd) {
			c.roundTrips.Add(1)
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts one round trip per pipeline.
func (c *Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if counted(cmd) {
				c.roundTrips.Add(1)
				break
			}
		}
		return next(ctx, cmds)
	}
}

// ErrInjected is the error Faults uses when given a nil error.
var ErrInjected = errors.New("redistest: injected fault")

// Faults is a go-redis hook that injects faults into a client: install it
// with rdb.AddHook(f), then arm it with FailNext or DropReplyNext. Only
// commands accepted by the Match predicate are affected; by default that is
// every command except Pub/Sub commands and the connection handshake (HELLO,
// AUTH, CLIENT, SELECT, READONLY), so a fault lands on the caller's command
// even when go-redis dials a new connection for it.
//
// A fault replaces go-redis's own handling: an injected error is not retried.
// In a pipeline, an armed FailNext fails the whole pipeline (nothing is sent
// and every command gets the error), while DropReplyNext sends the pipeline
// and replaces the replies of the affected commands only. Each affected
// command uses up one of n. When both are armed, FailNext goes first.
//
// Safe for concurrent use; the zero value is ready to use and injects nothing.
type Faults struct {
	mu       sync.Mutex
	fail     int
	failErr  error
	drop     int
	dropErr  error
	match    func(redis.Cmder) bool
	delay    time.Duration
	injected int64
}

var _ redis.Hook = (*Faults)(nil)

// FailNext makes the next n affected commands fail with err without being
// sent to the server. A nil err means ErrInjected; n <= 0 disarms.
func (f *Faults) FailNext(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail, f.failErr = max(n, 0), orInjected(err)
}

// DropReplyNext makes the next n affected commands reach the server and run
// there, while the caller gets err instead of the reply: a reply lost to a
// timeout or a cancelled context. A nil err means ErrInjected; n <= 0
// disarms.
func (f *Faults) DropReplyNext(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drop, f.dropErr = max(n, 0), orInjected(err)
}

// Delay holds each command (or pipeline) a fault is injected into for d
// before the fault: a reply that comes late and is then lost, or a server
// that takes that long to be found unreachable, after a caller that
// waits a shorter time gave up on it. 0 (the default) holds nothing.
func (f *Faults) Delay(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delay = d
}

// Match limits the faults to commands for which pred returns true, for
// example only scripts:
//
//	f.Match(func(c redis.Cmder) bool { n := c.Name(); return n == "evalsha" || n == "eval" })
//
// Command names are lower case. A nil pred restores the default. pred must
// not call f's methods.
func (f *Faults) Match(pred func(redis.Cmder) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.match = pred
}

// Injected returns how many commands have been failed or had their reply
// dropped so far.
func (f *Faults) Injected() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.injected
}

// DialHook passes dials through.
func (f *Faults) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook injects faults into single commands.
func (f *Faults) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !f.matches(cmd) {
			return next(ctx, cmd)
		}
		failErr, dropErr := f.take(1)
		if failErr != nil || dropErr != nil {
			f.hold()
		}
		switch {
		case failErr != nil:
			cmd.SetErr(failErr)
			return failErr
		case dropErr != nil:
			_ = next(ctx, cmd)
			cmd.SetErr(dropErr)
			return dropErr
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook injects faults into pipelines and transactions.
func (f *Faults) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var sel []redis.Cmder
		for _, c := range cmds {
			if f.matches(c) {
				sel = append(sel, c)
			}
		}
		if len(sel) == 0 {
			return next(ctx, cmds)
		}
		failErr, dropErr, k := f.takeUpTo(len(sel))
		if failErr != nil || dropErr != nil {
			f.hold()
		}
		switch {
		case failErr != nil:
			for _, c := range cmds {
				c.SetErr(failErr)
			}
			return failErr
		case dropErr != nil:
			_ = next(ctx, cmds)
			for _, c := range sel[:k] {
				c.SetErr(dropErr)
			}
			return dropErr
		}
		return next(ctx, cmds)
	}
}

// hold sleeps for the delay set by Delay.
func (f *Faults) hold() {
	f.mu.Lock()
	d := f.delay
	f.mu.Unlock()
	time.Sleep(d)
}

func (f *Faults) matches(cmd redis.Cmder) bool {
	f.mu.Lock()
	pred := f.match
	f.mu.Unlock()
	if pred == nil {
		return defaultMatch(cmd)
	}
	return pred(cmd)
}

func (f *Faults) take(n int) (failErr, dropErr error) {
	failErr, dropErr, _ = f.takeUpTo(n)
	return failErr, dropErr
}

// takeUpTo uses up to n armed faults of one kind. It returns the error to
// inject (at most one of the two is non-nil) and how many were used.
func (f *Faults) takeUpTo(n int) (failErr, dropErr error, k int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.fail > 0:
		k = min(n, f.fail)
		f.fail -= k
		f.injected += int64(k)
		return f.failErr, nil, k
	case f.drop > 0:
		k = min(n, f.drop)
		f.drop -= k
		f.injected += int64(k)
		return nil, f.dropErr, k
	}
	return nil, nil, 0
}

func orInjected(err error) error {
	if err == nil {
		return ErrInjected
	}
	return err
}

// defaultMatch accepts every command but Pub/Sub and connection set-up.
func defaultMatch(cmd redis.Cmder) bool {
	if isSetup(cmd) {
		return false
	}
	switch strings.ToLower(cmd.Name()) {
	case "subscribe", "unsubscribe", "psubscribe", "punsubscribe",
		"ssubscribe", "sunsubscribe", "publish", "spublish", "pubsub":
		return false
	}
	return true
}

// counted reports whether a Counter counts cmd: not connection set-up, nor
// the topology and command-info look-ups of a cluster client.
func counted(cmd redis.Cmder) bool {
	if isSetup(cmd) {
		return false
	}
	switch strings.ToLower(cmd.Name()) {
	case "cluster", "command":
		return false
	}
	return true
}

// isSetup reports whether cmd is one go-redis sends when it sets up a
// connection.
func isSetup(cmd redis.Cmder) bool {
	switch strings.ToLower(cmd.Name()) {
	case "hello", "auth", "client", "select", "readonly":
		return true
	}
	return false
}

// Recorder is a go-redis hook that remembers the scripts (EVALSHA and EVAL)
// a client sends, so that a test can send one again exactly as go-redis does
// after a read timeout — possibly after other calls ran in between:
//
//	rec := &redistest.Recorder{}
//	rdb.AddHook(rec)
//	m.Unlock(ctx)                       // the call whose reply "timed out"
//	args := rec.Last()
//	m.Lock(ctx)                         // another call of the same owner
//	rdb.Do(ctx, args...)                // go-redis's retry arrives late
//
// Safe for concurrent use; the zero value is ready to use.
type Recorder struct {
	mu      sync.Mutex
	scripts [][]any
}

var _ redis.Hook = (*Recorder)(nil)

// Last returns the arguments of the last script sent, or nil.
func (r *Recorder) Last() []any {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.scripts) == 0 {
		return nil
	}
	return r.scripts[len(r.scripts)-1]
}

// All returns the arguments of every script sent, oldest first.
func (r *Recorder) All() [][]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]any(nil), r.scripts...)
}

// Reset forgets what was recorded.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.scripts = nil
}

func (r *Recorder) record(cmd redis.Cmder) {
	if n := cmd.Name(); n != "evalsha" && n != "eval" {
		return
	}
	args := append([]any(nil), cmd.Args()...)
	r.mu.Lock()
	r.scripts = append(r.scripts, args)
	r.mu.Unlock()
}

// DialHook passes dials through.
func (r *Recorder) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook records scripts.
func (r *Recorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.record(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook records the scripts of a pipeline.
func (r *Recorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			r.record(cmd)
		}
		return next(ctx, cmds)
	}
}
