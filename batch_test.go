package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A batchGate holds the scripts that name hold (a name) until open is
// closed, and records how many scripts each pipeline carries; with drop
// set, the replies of the next pipeline are lost after the server ran it.
type batchGate struct {
	hold     string
	heldOnce sync.Once
	held     chan struct{} // closed when a script naming hold is held
	open     chan struct{}
	drop     atomic.Bool

	mu    sync.Mutex
	pipes []int
}

func newBatchGate(hold string) *batchGate {
	return &batchGate{hold: hold, held: make(chan struct{}), open: make(chan struct{})}
}

// scriptNames reports whether cmd is a script call with a key or argument
// that contains name.
func scriptNames(cmd redis.Cmder, name string) bool {
	if cmd.Name() != "evalsha" {
		return false
	}
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && strings.Contains(s, name) {
			return true
		}
	}
	return false
}

func (g *batchGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *batchGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if scriptNames(cmd, g.hold) {
			g.heldOnce.Do(func() { close(g.held) })
			<-g.open
		}
		return next(ctx, cmd)
	}
}

func (g *batchGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, c := range cmds {
			if c.Name() == "evalsha" {
				n++
			}
		}
		if n > 0 {
			g.mu.Lock()
			g.pipes = append(g.pipes, n)
			g.mu.Unlock()
		}
		err := next(ctx, cmds)
		if n > 0 && g.drop.CompareAndSwap(true, false) {
			for _, c := range cmds {
				c.SetErr(redistest.ErrInjected)
			}
			return redistest.ErrInjected
		}
		return err
	}
}

func (g *batchGate) pipelines() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.pipes...)
}

// heldBatch starts a Lock of a name whose script g holds, and then one Lock
// in a goroutine for each of names, which queue behind it (c lets one call
// be in flight, and its queue wait for it a minute). It returns when all k
// are queued, with the channel that gets their errors. ms has the handles:
// the held one first, then one for each of names.
func heldBatch(t *testing.T, ctx context.Context, c *dsync.Client, g *batchGate, names []string) (held, errs <-chan error, ms []*dsync.Mutex) {
	t.Helper()
	dsync.SetCoalescing(c, 1, time.Minute)
	ms = append(ms, c.Mutex(g.hold))
	h := make(chan error, 1)
	go func() { h <- ms[0].Lock(ctx) }()
	select {
	case <-g.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the held Lock never reached the server")
	}
	out := make(chan error, len(names))
	for _, n := range names {
		m := c.Mutex(n)
		ms = append(ms, m)
		go func() { out <- m.Lock(ctx) }()
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("%d calls queued", len(names)), func() bool { return dsync.Queued(c) == len(names) })
	return h, out, ms
}

func batchNames(t *testing.T, k int) []string {
	base := redistest.Key(t)
	out := make([]string, k)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", base, i)
	}
	return out
}

// A batchRig is a Client whose scripts on g.hold are held by g, its
// connection, a context that bounds the test's calls, and names to queue.
type batchRig struct {
	ctx   context.Context
	g     *batchGate
	c     *dsync.Client
	rdb   redis.UniversalClient
	names []string
}

// newBatchRig returns a batchRig on b with k names.
func newBatchRig(t *testing.T, b redistest.Backend, k int) *batchRig {
	r := &batchRig{ctx: ctxT(t), g: newBatchGate(redistest.Key(t)), names: batchNames(t, k)}
	r.c, r.rdb = hookedClient(t, b, r.g)
	return r
}

// eachHeldBatch runs f on each backend with a batchRig of k names whose
// Locks are queued behind the held one (see heldBatch): held and errs get
// their errors, ms has their handles.
func eachHeldBatch(t *testing.T, k int, f func(t *testing.T, b redistest.Backend, r *batchRig, held, errs <-chan error, ms []*dsync.Mutex)) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		r := newBatchRig(t, b, k)
		held, errs, ms := heldBatch(t, r.ctx, r.c, r.g, r.names)
		f(t, b, r, held, errs, ms)
	})
}

// open lets the held call through, checks that it returned nil and
// returns the errors of the len(r.names) calls queued behind it.
func (r *batchRig) open(t *testing.T, held, errs <-chan error) []error {
	t.Helper()
	close(r.g.open)
	must(t, <-held)
	var out []error
	for range r.names {
		out = append(out, <-errs)
	}
	return out
}

// assertHolds checks that each of names has a hold in Redis (want) or not,
// stopping the test with "name: msg" on the first that differs.
func (r *batchRig) assertHolds(t *testing.T, names []string, want bool, msg string) {
	t.Helper()
	for _, n := range names {
		if lockKeyExists(t, r.ctx, r.rdb, n) != want {
			t.Fatalf("%s: %s", n, msg)
		}
	}
}

// lockKeyExists reports whether the Mutex name has a hold in Redis.
func lockKeyExists(t *testing.T, ctx context.Context, rdb redis.UniversalClient, name string) bool {
	t.Helper()
	n, err := rdb.Exists(ctx, mutexKeys(name).Lock).Result()
	must(t, err)
	return n == 1
}

// Script calls that come while another is in flight go out together, in
// one pipeline, and each gets its own reply.
func TestCoalescedCallsShareOneRoundTrip(t *testing.T) {
	eachHeldBatch(t, 8, func(t *testing.T, b redistest.Backend, r *batchRig, held, errs <-chan error, ms []*dsync.Mutex) {
		for _, err := range r.open(t, held, errs) {
			must(t, err)
		}
		if p := r.g.pipelines(); len(p) != 1 || p[0] != len(r.names) {
			t.Fatalf("scripts per pipeline %v, want one pipeline of %d", p, len(r.names))
		}
		for i, n := range append([]string{r.g.hold}, r.names...) {
			r.assertHolds(t, []string{n}, true, "Lock returned nil, no hold in Redis")
			must(t, ms[i].Unlock(r.ctx))
			r.assertHolds(t, []string{n}, false, "Unlock returned nil, hold still in Redis")
		}
	})
}

// A call the server (or the network) holds does not hold up the Client's
// other calls: the queue goes out on its own after a short wait.
func TestHeldCallDoesNotHoldUpOthers(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		g := newBatchGate(redistest.Key(t))
		c, _ := hookedClient(t, b, g)
		t.Cleanup(func() { close(g.open) })
		go func() { _ = c.Mutex(g.hold).Lock(context.Background()) }()
		<-g.held
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, n := range batchNames(t, 3) {
			m := c.Mutex(n)
			if err := m.Lock(ctx); err != nil {
				t.Fatalf("Lock while another call is held: %v", err)
			}
			must(t, m.Unlock(ctx))
		}
	})
}

// A caller whose ctx ends while its call waits in the queue returns then,
// and leaves nothing behind.
func TestCancelWhileQueued(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		r := newBatchRig(t, b, 2)
		g, names := r.g, r.names
		qctx, cancel := context.WithCancel(r.ctx)
		held, errs, _ := heldBatch(t, qctx, r.c, g, names[:1])
		cancel()
		select {
		case err := <-errs:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("queued Lock after cancel = %v, want context.Canceled", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("queued Lock did not return at its cancel")
		}
		close(g.open)
		<-held
		// The cancelled call was not sent, or was undone: the name is free.
		waitFor(t, 5*time.Second, "the name of a cancelled queued Lock to be free", func() bool {
			return !lockKeyExists(t, r.ctx, r.rdb, names[0])
		})
	})
}

// Calls of a batch whose scripts the server forgot (SCRIPT FLUSH, a
// restart) load them and run.
func TestCoalescedCallsAfterScriptFlush(t *testing.T) {
	eachHeldBatch(t, 4, func(t *testing.T, b redistest.Backend, r *batchRig, held, errs <-chan error, _ []*dsync.Mutex) {
		must(t, nemMasters(r.ctx, b.NewClient(t), func(ctx context.Context, m *redis.Client) error {
			return m.ScriptFlush(ctx).Err()
		}))
		for _, err := range r.open(t, held, errs) {
			must(t, err)
		}
		r.assertHolds(t, r.names, true, "Lock returned nil, no hold in Redis")
	})
}

// When the replies of a batch are lost after the server ran it, every
// caller fails (none can know it holds), and the failed calls leave no
// hold behind.
func TestCoalescedCallsWithLostReplies(t *testing.T) {
	eachHeldBatch(t, 4, func(t *testing.T, b redistest.Backend, r *batchRig, held, errs <-chan error, _ []*dsync.Mutex) {
		r.g.drop.Store(true)
		for _, err := range r.open(t, held, errs) {
			if err == nil {
				t.Fatal("a Lock whose reply was lost returned nil")
			}
		}
		if r.g.drop.Load() {
			t.Fatal("no batch went out")
		}
		r.assertHolds(t, r.names, false, "a failed Lock left a hold in Redis")
	})
}
