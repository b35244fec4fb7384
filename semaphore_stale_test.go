package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/lua"
)

// onceHook runs a one-shot handler around the next EVALSHA of a script
// (alone or in a pipeline), and counts the attempts of each Semaphore
// Acquire call (by call id, ARGV[5]).
type onceHook struct {
	mu       sync.Mutex
	once     map[string]func(run func() error) error // by script sha
	attempts map[string]int
}

func newOnceHook() *onceHook {
	return &onceHook{once: map[string]func(func() error) error{}, attempts: map[string]int{}}
}

// on makes the next call of script name go through f (f calls run to send it).
func (h *onceHook) on(name string, f func(run func() error) error) {
	h.mu.Lock()
	h.once[lua.Script(name).Hash()] = f
	h.mu.Unlock()
}

func (h *onceHook) take(cmd redis.Cmder) func(func() error) error {
	a := cmd.Args()
	if cmd.Name() != "evalsha" || len(a) < 2 {
		return nil
	}
	sha, _ := a[1].(string)
	h.mu.Lock()
	defer h.mu.Unlock()
	if sha == lua.Script("semaphore_acquire").Hash() && len(a) > 13 {
		if id, ok := a[13].(string); ok {
			h.attempts[id]++
		}
	}
	f := h.once[sha]
	delete(h.once, sha)
	return f
}

func (h *onceHook) resetAttempts() {
	h.mu.Lock()
	clear(h.attempts)
	h.mu.Unlock()
}

func (h *onceHook) maxAttempts() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := 0
	for _, n := range h.attempts {
		m = max(m, n)
	}
	return m
}

func (h *onceHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *onceHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if f := h.take(cmd); f != nil {
			return f(func() error { return next(ctx, cmd) })
		}
		return next(ctx, cmd)
	}
}
func (h *onceHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if f := h.take(c); f != nil {
				return f(func() error { return next(ctx, cmds) })
			}
		}
		return next(ctx, cmds)
	}
}

// holdReply makes the next call of script run and then hold its reply
// back until release is called (at t's cleanup at the latest, or after
// 30 s); ran waits until the script ran (10 s at most), what naming it.
func (h *onceHook) holdReply(t *testing.T, script string) (ran func(what string), release func()) {
	done, open := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(open) }) }
	t.Cleanup(release)
	h.on(script, func(run func() error) error {
		err := run()
		close(done)
		select {
		case <-open:
		case <-time.After(30 * time.Second):
		}
		return err
	})
	ran = func(what string) {
		t.Helper()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not run", what)
		}
	}
	return ran, release
}

func recvErr(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return", what)
		return nil
	}
}

// A handle without owner (or an owner): its call B is handed a fresh holding
// F1 (notification held back); a Release through the handle (the handle
// knows no holding: it names none) ends F1, its reply late; another
// Acquire through the handle takes a fresh holding F2. B's hand-over,
// accepted without asking the script, then arrives: F2 must stay the
// handle's live holding, as it is in Redis.
func TestSemaphoreStaleGrantKeepsLaterHolding(t *testing.T) {
	for _, owned := range []bool{false, true} {
		t.Run(fmt.Sprintf("owner=%v", owned), func(t *testing.T) { testStaleGrantKeepsLaterHolding(t, owned) })
	}
}

func testStaleGrantKeepsLaterHolding(t *testing.T, owned bool) {
	b, ctx, name := realName(t)
	qctx := ctx // another Client's calls, without the owner
	if owned {
		// The same with an owner, whose permits add up as a handle's do.
		ctx = dsync.WithOwner(ctx)
	}
	hk := newOnceHook()
	c, _ := hookedClient(t, b, hk)
	msgs := newHeldMessages()
	t.Cleanup(msgs.release)
	dsync.SetMessageHook(c, msgs.hook)
	s := c.Semaphore(name, 1)
	q := newClient(t, b).Semaphore(name, 1)

	// Load the scripts; subscribe c to the channel (a wait that times out).
	must(t, s.Acquire(ctx, 1))
	must(t, s.Release(ctx, 1))
	must(t, q.Acquire(qctx, 1))
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	mustIs(t, s.Acquire(wctx, 1), context.DeadlineExceeded, "warm-up wait: %v")
	cancel()
	dsync.WaitCleanups(c)

	hk.resetAttempts()
	bIn := async(func() error { return s.Acquire(ctx, 1) })
	waitQueued(t, b, name, 1)
	msgs.arm()
	must(t, q.Release(qctx, 1)) // F1 handed to B; B does not hear of it yet

	ran, release := hk.holdReply(t, "semaphore_release")
	rIn := async(func() error { return s.Release(ctx, 1) }) // ends F1
	ran("the release")
	must(t, s.Acquire(ctx, 1)) // F2
	l2, err := s.Lease(ctx)
	must(t, err)
	msgs.release()
	must(t, recvErr(t, bIn, "B"))
	release()
	must(t, recvErr(t, rIn, "the release"))
	if n := hk.maxAttempts(); n != 1 {
		t.Fatalf("B made %d attempts, want 1 (it must learn of F1 from the notification)", n)
	}

	// Redis holds F2 for the handle.
	if ok, err := q.TryAcquire(qctx, 1); err != nil || ok {
		t.Fatalf("another Client's TryAcquire = %v, %v; want false: the handle holds F2", ok, err)
	}
	if err := l2.Err(); err != nil {
		t.Errorf("F2's Lease: Err = %v, want nil (Redis holds it)", err)
	}
	if err := s.Release(ctx, 1); err != nil {
		t.Errorf("Release of F2's permit = %v, want nil", err)
	}
	if ok, err := q.TryAcquire(qctx, 1); err != nil || !ok {
		t.Errorf("after the handle's Release, another Client's TryAcquire = %v, %v; want true", ok, err)
	}
}

// An Acquire through a handle without owner took a fresh
// holding F (its reply late); a Release through the handle, which knows no
// holding yet (it names none), ends F, and the reply the caller gets is
// that of a resend of it (go-redis after a read timeout). The handle must
// end up holding nothing, as in Redis.
func TestSemaphoreRepeatedUnnamedReleaseEndsHolding(t *testing.T) {
	for _, owned := range []bool{false, true} {
		t.Run(fmt.Sprintf("owner=%v", owned), func(t *testing.T) { testRepeatedUnnamedReleaseEndsHolding(t, owned) })
	}
}

func testRepeatedUnnamedReleaseEndsHolding(t *testing.T, owned bool) {
	b, ctx, name := realName(t)
	qctx := ctx // another Client's calls, without the owner
	if owned {
		ctx = dsync.WithOwner(ctx)
	}
	hk := newOnceHook()
	c, _ := hookedClient(t, b, hk)
	s := c.Semaphore(name, 1)
	must(t, s.Acquire(ctx, 1)) // load the scripts
	must(t, s.Release(ctx, 1))

	ran, release := hk.holdReply(t, "semaphore_acquire")
	aIn := async(func() error { return s.Acquire(ctx, 1) })
	ran("the acquire")
	hk.on("semaphore_release", func(run func() error) error {
		_ = run()    // the first reply is lost
		return run() // go-redis's resend answers
	})
	must(t, s.Release(ctx, 1)) // ends F
	release()
	must(t, recvErr(t, aIn, "the Acquire"))

	if ok, err := newClient(t, b).Semaphore(name, 1).TryAcquire(qctx, 1); err != nil || !ok {
		t.Fatalf("another Client's TryAcquire = %v, %v; want true: Redis holds nothing", ok, err)
	}
	if l, err := s.Lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
		t.Errorf("Lease = %v, %v; want ErrNotHeld (the handle holds nothing)", l, err)
	}
	if err := s.Release(ctx, 1); !errors.Is(err, dsync.ErrNotHeld) {
		t.Errorf("Release = %v, want ErrNotHeld", err)
	}
}
