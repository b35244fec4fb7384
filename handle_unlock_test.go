package dsync_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A pairGate, once armed, holds the first script naming name until a
// second one arrives (5 s at most), so that two calls are in flight at once.
type pairGate struct {
	name  string
	armed atomic.Bool // from then on
	mu    sync.Mutex
	n     int
	both  chan struct{}
}

func (g *pairGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *pairGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if g.armed.Load() && scriptNames(cmd, g.name) {
			g.mu.Lock()
			g.n++
			if g.n == 2 {
				close(g.both)
			}
			g.mu.Unlock()
			select {
			case <-g.both:
			case <-time.After(5 * time.Second):
			}
		}
		return next(ctx, cmd)
	}
}

func (g *pairGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Two Unlocks of one hold of a handle (no owner), at once: as with
// sync.Mutex, one unlocks and the other finds nothing held, on Mutex and
// RWMutex alike.
func TestConcurrentHandleUnlocksOneSucceeds(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, kind := range []string{"Mutex", "RWMutex"} {
			t.Run(kind, func(t *testing.T) {
				ctx := ctxT(t)
				name := redistest.Key(t)
				g := &pairGate{name: name, both: make(chan struct{})}
				c, _ := hookedClient(t, b, g)
				var l locker = c.Mutex(name)
				if kind == "RWMutex" {
					l = c.RWMutex(name)
				}
				must(t, l.Lock(ctx))
				g.armed.Store(true) // only the Unlocks meet at the gate
				errs := make(chan error, 2)
				for range 2 {
					go func() { errs <- l.Unlock(ctx) }()
				}
				var ok, notHeld int
				for range 2 {
					switch err := <-errs; {
					case err == nil:
						ok++
					case errors.Is(err, dsync.ErrNotHeld):
						notHeld++
					default:
						t.Fatalf("Unlock = %v", err)
					}
				}
				if ok != 1 || notHeld != 1 {
					t.Fatalf("two Unlocks of one hold: %d nil, %d ErrNotHeld; want one of each", ok, notHeld)
				}
			})
		}
	})
}
