//go:build unix

package dsync_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// pausingCtx is a ctx whose first Value lookup after it is armed blocks
// until released: it holds the calling goroutine there, as the scheduler
// may, to open a race window every time.
type pausingCtx struct {
	context.Context
	armed   atomic.Bool
	reached chan struct{}
	release chan struct{}
}

func (c *pausingCtx) Value(k any) any {
	if c.armed.CompareAndSwap(true, false) {
		close(c.reached)
		<-c.release
	}
	return c.Context.Value(k)
}

// An Unlock (RWMutex Unlock, Semaphore Release) that passed the Client's
// closed check just before Close, and reaches its release after Close
// (held at its owner lookup, between the two), while Redis does not answer
// (the server stopped with SIGSTOP), returns by its ctx deadline like any
// call; before, it ran the release on the caller's goroutine for its
// whole 5 s bound.
func TestReleaseAcrossCloseKeepsDeadline(t *testing.T) {
	if _, ok := redistest.Real(t); !ok {
		t.Skip("needs redis-server on PATH (a server to stop)")
	}
	const d = 500 * time.Millisecond
	s := redistest.StartStandalone(t)
	pid := serverPid(t, s.Client(t))
	stop := func() { must(t, syscall.Kill(pid, syscall.SIGSTOP)) }
	cont := func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
	t.Cleanup(cont)
	ctx := ctxT(t)
	for _, what := range []string{"Mutex.Unlock", "Mutex.Unlock owner", "RWMutex.Unlock", "Semaphore.Release"} {
		t.Run(what, func(t *testing.T) {
			cont()
			rdb := redis.NewClient(&redis.Options{Addr: s.Addr()})
			t.Cleanup(func() { rdb.Close() })
			c := dsync.New(rdb)
			name := redistest.Key(t)
			octx := dsync.WithOwner(ctx)
			base := context.Background()
			var unlock func(context.Context) error
			switch what {
			case "Mutex.Unlock":
				m := c.Mutex(name)
				must(t, m.Lock(ctx))
				unlock = m.Unlock
			case "Mutex.Unlock owner":
				m := c.Mutex(name)
				must(t, m.Lock(octx))
				unlock = m.Unlock
				base = dsync.WithOwnerToken(base, dsync.OwnerToken(octx))
			case "RWMutex.Unlock":
				m := c.RWMutex(name)
				must(t, m.Lock(ctx))
				unlock = m.Unlock
			case "Semaphore.Release":
				sem := c.Semaphore(name, 1)
				must(t, sem.Acquire(ctx, 1))
				unlock = func(ctx context.Context) error { return sem.Release(ctx, 1) }
			}
			stop()
			dctx, cancel := context.WithTimeout(base, d)
			defer cancel()
			pc := &pausingCtx{Context: dctx, reached: make(chan struct{}), release: make(chan struct{})}
			pc.armed.Store(true)
			start := time.Now()
			done := make(chan error, 1)
			go func() { done <- unlock(pc) }()
			<-pc.reached // past the closed check, looking up the owner
			c.Close()
			close(pc.release)
			err := <-done
			took := time.Since(start)
			t.Logf("%s: %v after %v (deadline %v)", what, err, took.Round(time.Millisecond), d)
			if took > d+400*time.Millisecond {
				t.Errorf("%s with a %v deadline, Close in between, server stopped: returned after %v (%v)", what, d, took.Round(time.Millisecond), err)
			}
			// The release goes on to its own bound; let it end before the
			// next case (and the test's goroutine check).
			cont()
			time.Sleep(100 * time.Millisecond)
		})
	}
}

// serverPid returns the process id of the server rdb talks to.
func serverPid(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "server").Result()
	must(t, err)
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(l, "process_id:"); ok {
			pid, err := strconv.Atoi(strings.TrimSpace(v))
			must(t, err)
			return pid
		}
	}
	t.Fatal("INFO server has no process_id")
	return 0
}
