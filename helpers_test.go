package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// Helpers every test file of the package uses.

// eachBackend runs f on miniredis and, when available, a real redis-server
// and a real 3-master Redis Cluster.
func eachBackend(t *testing.T, f func(t *testing.T, b redistest.Backend)) {
	for _, b := range redistest.AllBackends(t) {
		t.Run(b.Name, func(t *testing.T) { f(t, b) })
	}
}

// eachName runs f on each backend (see eachBackend) with a context that
// bounds the test's calls (see ctxT) and a name of its own.
func eachName(t *testing.T, f func(t *testing.T, b redistest.Backend, ctx context.Context, name string)) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) { f(t, b, ctxT(t), redistest.Key(t)) })
}

// eachOwnerName runs f as eachName does, with a ctx that carries an owner
// of its own (see dsync.WithOwner).
func eachOwnerName(t *testing.T, f func(t *testing.T, b redistest.Backend, ctx context.Context, name string)) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		f(t, b, dsync.WithOwner(ctx), name)
	})
}

// eachRealName runs f as eachName does, on the backends whose TTLs run
// down by themselves: the real server and the cluster.
func eachRealName(t *testing.T, f func(t *testing.T, b redistest.Backend, ctx context.Context, name string)) {
	for _, b := range redistest.AllBackends(t) {
		if b.Mini != nil {
			continue
		}
		t.Run(b.Name, func(t *testing.T) { f(t, b, ctxT(t), redistest.Key(t)) })
	}
}

// newClient returns a dsync Client on a fresh connection to b, closed at cleanup.
func newClient(t *testing.T, b redistest.Backend, opts ...dsync.Option) *dsync.Client {
	t.Helper()
	c := dsync.New(b.NewClient(t), opts...)
	t.Cleanup(func() { c.Close() })
	return c
}

// ctxT returns a context that bounds a test's calls, cancelled at cleanup.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// realOnly returns the real server backend or skips: its callers need TTLs
// that run down by themselves (miniredis TTLs move only when told) or a
// server that runs commands truly in parallel with the test.
func realOnly(t *testing.T) redistest.Backend {
	t.Helper()
	b, ok := redistest.Real(t)
	if !ok {
		t.Skip("needs redis-server")
	}
	return b
}

// realName returns the real server backend (or skips: see realOnly), a
// context that bounds the test's calls and a name of its own.
func realName(t *testing.T) (redistest.Backend, context.Context, string) {
	t.Helper()
	return realOnly(t), ctxT(t), redistest.Key(t)
}

// must stops the test on err.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// recvNil waits up to limit for the error ch delivers and stops the test if
// it is not nil, or with msg if none comes by then.
func recvNil(t testing.TB, ch <-chan error, limit time.Duration, msg string) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(limit):
		t.Fatal(msg)
	}
}

// holdCalls are the calls of one kind of hold on a name through one
// handle: take it waiting or trying, give it back, read its Lease.
type holdCalls struct {
	lock   func(context.Context) error
	try    func(context.Context) (bool, error)
	unlock func(context.Context) error
	lease  func(context.Context) (*dsync.Lease, error)
}

// holdKind returns the holdCalls of one kind of hold on name through a new
// handle of c.
type holdKind func(c *dsync.Client, name string) holdCalls

// mutexHold, writeHold and readHold are the holdKinds of a Mutex and of an
// RWMutex's write and read holds.
func mutexHold(c *dsync.Client, name string) holdCalls {
	m := c.Mutex(name)
	return holdCalls{m.Lock, m.TryLock, m.Unlock, m.Lease}
}

func writeHold(c *dsync.Client, name string) holdCalls {
	rw := c.RWMutex(name)
	return holdCalls{rw.Lock, rw.TryLock, rw.Unlock, rw.Lease}
}

func readHold(c *dsync.Client, name string) holdCalls {
	rw := c.RWMutex(name)
	return holdCalls{rw.RLock, rw.TryRLock, rw.RUnlock, rw.RLease}
}

// semHold returns the holdKind of n permits of a Semaphore of size.
func semHold(size, n int64) holdKind {
	return func(c *dsync.Client, name string) holdCalls { return semCalls(c.Semaphore(name, size), n) }
}

// semCalls returns the holdCalls of n permits through s.
func semCalls(s *dsync.Semaphore, n int64) holdCalls {
	return holdCalls{
		lock:   func(ctx context.Context) error { return s.Acquire(ctx, n) },
		try:    func(ctx context.Context) (bool, error) { return s.TryAcquire(ctx, n) },
		unlock: func(ctx context.Context) error { return s.Release(ctx, n) },
		lease:  s.Lease,
	}
}

// assertBookkeepingOnly checks that of a free name's keys ks only fence (the
// fencing counter) and calls (the call ids) are left, each with an expiry,
// the call ids' within the replay window.
func assertBookkeepingOnly(t *testing.T, b redistest.Backend, ks []string, fence, calls string) {
	t.Helper()
	rdb := b.NewClient(t)
	ctx := context.Background()
	for _, k := range ks {
		n, err := rdb.Exists(ctx, k).Result()
		must(t, err)
		if n == 0 {
			continue
		}
		if k != fence && k != calls {
			dump, _ := rdb.Dump(ctx, k).Result()
			t.Errorf("key %s left after release (%q), want only the fence hash and the call ids", k, dump)
			continue
		}
		if ttl, _ := rdb.PTTL(ctx, k).Result(); ttl <= 0 {
			t.Errorf("%s has no expiry (PTTL %v)", k, ttl)
		} else if k == calls && ttl > replayWindow {
			t.Errorf("%s expires in %v, want within the replay window %v", k, ttl, replayWindow)
		}
	}
}

// hookedClient returns a dsync Client made with opts on a fresh connection
// to b with hook added, closed at cleanup, and that connection.
func hookedClient(t *testing.T, b redistest.Backend, hook redis.Hook, opts ...dsync.Option) (*dsync.Client, redis.UniversalClient) {
	t.Helper()
	rdb := b.NewClient(t)
	rdb.AddHook(hook)
	c := dsync.New(rdb, opts...)
	t.Cleanup(func() { c.Close() })
	return c, rdb
}

// lockLeaser is a handle that write-locks and has a Lease: a Mutex or an
// RWMutex.
type lockLeaser interface {
	Lock(context.Context) error
	Lease(context.Context) (*dsync.Lease, error)
}

// lockLease locks h and returns its Lease, stopping the test on an error.
func lockLease(t testing.TB, ctx context.Context, h lockLeaser) *dsync.Lease {
	t.Helper()
	must(t, h.Lock(ctx))
	l, err := h.Lease(ctx)
	must(t, err)
	return l
}

// lockLeaseOf takes h's hold and returns its Lease, stopping the test with
// what and the error on a failure.
func lockLeaseOf(t testing.TB, ctx context.Context, h holdCalls, what string) *dsync.Lease {
	t.Helper()
	if err := h.lock(ctx); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	l, err := h.lease(ctx)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return l
}

// assertLeaseLost checks that l reports ErrLeaseLost.
func assertLeaseLost(t testing.TB, l *dsync.Lease) {
	t.Helper()
	if err := l.Err(); !errors.Is(err, dsync.ErrLeaseLost) {
		t.Errorf("Err = %v, want ErrLeaseLost", err)
	}
}

// mustIs stops the test with msg, a format whose one verb is for err,
// unless errors.Is(err, target); checkIs reports the same and lets the test
// go on.
func mustIs(t testing.TB, err, target error, msg string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf(msg, err)
	}
}

func checkIs(t testing.TB, err, target error, msg string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf(msg, err)
	}
}

// gotIn returns a probe that reports whether try takes the name for ctx's
// owner, giving it back through release if it did.
func gotIn(t *testing.T, ctx context.Context, try func(context.Context) (bool, error), release func(context.Context) error) func() bool {
	return func() bool {
		t.Helper()
		ok, err := try(ctx)
		must(t, err)
		if ok {
			must(t, release(ctx))
		}
		return ok
	}
}

// writeFree reports whether rw's TryLock for ctx's owner takes the name,
// and gives it back if it did.
func writeFree(t *testing.T, ctx context.Context, rw *dsync.RWMutex) bool {
	t.Helper()
	return gotIn(t, ctx, rw.TryLock, rw.Unlock)()
}

// unlockLevels gives back n levels of an owner's hold through unlock,
// checking before each that another owner does not get in (getsIn) and
// after the last that it does: no level is lost or leaked.
func unlockLevels(t *testing.T, n int, getsIn func() bool, unlock func() error, what string) {
	t.Helper()
	for i := 0; i < n; i++ {
		if getsIn() {
			t.Fatalf("%s: another owner got in while the owner holds %d of %d levels", what, n-i, n)
		}
		must(t, unlock())
	}
	if !getsIn() {
		t.Fatalf("%s: not free for another owner after the owner's last unlock (a level leaked)", what)
	}
}

// untilClosed runs step at most n times, until stop is closed or step
// returns false.
func untilClosed(stop <-chan struct{}, n int, step func() bool) {
	for i := 0; i < n; i++ {
		select {
		case <-stop:
			return
		default:
		}
		if !step() {
			return
		}
	}
}

// async starts f and returns the channel of its result.
func async(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}
