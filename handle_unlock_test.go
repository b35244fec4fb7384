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
	"github.com/dsync-go/dsync/lua"
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

// An RWMutex handle without an owner holds a read; the RUnlock of it gets
// no reply (the script ran: the hold is gone in Redis) and returns the
// error, its ctx still open. Another goroutine's RLock through the handle
// comes in between, and then the RUnlock is repeated, as a caller does
// after an error whose outcome is unknown. The repeat must settle the first
// RUnlock (its call id, its hold), not end the read hold the RLock just
// took: the handle then holds one read, in Redis as in its records, and a
// writer of another process waits for it. (Before, the repeat ended the
// new hold: Redis held no reader, the handle's RLease reported its first,
// ended hold live until a renewal found it gone, and another process's
// TryLock took the write lock.)
func TestRWMutexHandleRUnlockRetryAfterAnotherRLock(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		f := scriptFaults("rwmutex_unlock")
		c, _ := hookedClient(t, b, f)
		rw := c.RWMutex(name)
		// The scripts are loaded: the lost reply is of one that ran.
		must(t, rw.RLock(ctx))
		must(t, rw.RUnlock(ctx))
		must(t, rw.RLock(ctx))
		f.DropReplyNext(1, nil)
		if err := rw.RUnlock(ctx); !errors.Is(err, redistest.ErrInjected) {
			t.Fatalf("RUnlock whose reply is lost = %v, want the injected error", err)
		}
		// Another goroutine of the handle reads meanwhile.
		must(t, rw.RLock(ctx))
		// The repeat of the RUnlock whose outcome was unknown.
		must(t, rw.RUnlock(ctx))
		l, err := rw.RLease(ctx)
		if err != nil {
			t.Fatalf("RLease with one read hold left = %v", err)
		}
		n, err := b.NewClient(t).ZCard(ctx, rwk(name).Readers).Result()
		must(t, err)
		other := newClient(t, b).RWMutex(name)
		if ok, err := other.TryLock(ctx); err != nil || ok {
			if ok {
				must(t, other.Unlock(ctx))
			}
			t.Fatalf("another process's TryLock while the handle holds a read (its Lease: %v; readers in Redis: %d) = %v, %v; want false", l.Err(), n, ok, err)
		}
		must(t, rw.RUnlock(ctx))
		checkIs(t, rw.RUnlock(ctx), dsync.ErrNotHeld, "extra RUnlock = %v, want ErrNotHeld")
		assertRWReleased(t, b, name)
	})
}

// An owner's Unlock (RUnlock) gets no reply: the script ran and ended the
// owner's hold in Redis, and the call returns the error, its ctx still
// open. Another goroutine of the owner locks meanwhile (a fresh hold in
// Redis), and then the first goroutine repeats its Unlock, as a caller does
// after an error whose outcome is unknown. The repeat must settle the
// first Unlock (its call id, the hold it ended), not end a level of the
// hold the other goroutine just took. (Before, the repeat was a new Unlock
// that ended the new hold: its Lease was done as released, and another
// owner took the name while the goroutine that locked it had not
// unlocked.)
func TestOwnerUnlockRetryAfterAnotherGoroutineLocked(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, kind := range []struct {
			name, script string
			calls        holdKind
		}{
			{"Mutex", "mutex_unlock", mutexHold},
			{"RWMutex.Lock", "rwmutex_unlock", writeHold},
			{"RWMutex.RLock", "rwmutex_unlock", readHold},
		} {
			t.Run(kind.name, func(t *testing.T) {
				ctx := dsync.WithOwner(ctxT(t))
				name := redistest.Key(t)
				f := scriptFaults(kind.script)
				c, _ := hookedClient(t, b, f)
				h := kind.calls(c, name)
				// The scripts are loaded: the lost reply is of one that ran.
				must(t, h.lock(ctx))
				must(t, h.unlock(ctx))
				must(t, h.lock(ctx))
				f.DropReplyNext(1, nil)
				if err := h.unlock(ctx); !errors.Is(err, redistest.ErrInjected) {
					t.Fatalf("unlock whose reply is lost = %v, want the injected error", err)
				}
				// Another goroutine of the owner locks meanwhile.
				must(t, h.lock(ctx))
				l, err := h.lease(ctx)
				must(t, err)
				// The repeat of the unlock whose outcome was unknown.
				if err := h.unlock(ctx); err != nil && !errors.Is(err, dsync.ErrLeaseLost) {
					t.Fatalf("repeated unlock = %v", err)
				}
				other := newClient(t, b).RWMutex(name)
				try := other.TryLock
				if kind.name == "Mutex" {
					try = newClient(t, b).Mutex(name).TryLock
				}
				if ok, err := try(dsync.WithOwner(ctx)); err != nil || ok {
					t.Fatalf("another owner's TryLock while the owner holds a level it took after the lost reply (its Lease done: %v, Err %v) = %v, %v; want false",
						isDone(l), l.Err(), ok, err)
				}
				must(t, h.unlock(ctx))
				checkIs(t, h.unlock(ctx), dsync.ErrNotHeld, "extra unlock = %v, want ErrNotHeld")
			})
		}
	})
}

func isDone(l *dsync.Lease) bool {
	select {
	case <-l.Done():
		return true
	default:
		return false
	}
}

// A replyGate, once armed, lets the next call of one script run on the
// server, then holds its reply until opened, and loses it: the caller gets
// redistest.ErrInjected, the script's work done.
type replyGate struct {
	sha  string
	mu   sync.Mutex
	arm  bool
	ran  chan struct{} // closed once the held script ran
	open chan struct{}
}

func newReplyGate(script string) *replyGate {
	return &replyGate{sha: lua.Script(script).Hash(), ran: make(chan struct{}), open: make(chan struct{})}
}

func (g *replyGate) armNext() {
	g.mu.Lock()
	g.arm = true
	g.mu.Unlock()
}

func (g *replyGate) take(cmd redis.Cmder) bool {
	a := cmd.Args()
	if cmd.Name() != "evalsha" || len(a) < 2 || a[1] != g.sha {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	held := g.arm
	g.arm = false
	return held
}

func (g *replyGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *replyGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !g.take(cmd) {
			return next(ctx, cmd)
		}
		_ = next(ctx, cmd)
		close(g.ran)
		select {
		case <-g.open:
		case <-time.After(20 * time.Second):
		}
		cmd.SetErr(redistest.ErrInjected)
		return redistest.ErrInjected
	}
}

func (g *replyGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// As in TestOwnerUnlockRetryAfterAnotherGoroutineLocked, an owner's Unlock
// (RUnlock) ends its hold in Redis and its reply is lost, its ctx still
// open; but the other goroutine's Lock takes its fresh hold, and learns of
// it, while the Unlock is still waiting for its reply. The Unlock's repeat
// must settle the first Unlock under its call id all the same, not end the
// hold the other goroutine took.
func TestOwnerUnlockRetryAfterALockDuringIt(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, kind := range []struct {
			name, script string
			calls        holdKind
		}{
			{"Mutex", "mutex_unlock", mutexHold},
			{"RWMutex.Lock", "rwmutex_unlock", writeHold},
			{"RWMutex.RLock", "rwmutex_unlock", readHold},
		} {
			t.Run(kind.name, func(t *testing.T) {
				ctx := dsync.WithOwner(ctxT(t))
				name := redistest.Key(t)
				g := newReplyGate(kind.script)
				c, _ := hookedClient(t, b, g)
				h := kind.calls(c, name)
				// The scripts are loaded: the lost reply is of one that ran.
				must(t, h.lock(ctx))
				must(t, h.unlock(ctx))
				must(t, h.lock(ctx))
				g.armNext()
				first := make(chan error, 1)
				go func() { first <- h.unlock(ctx) }()
				select {
				case <-g.ran:
				case <-time.After(10 * time.Second):
					t.Fatal("the unlock did not reach the server")
				}
				// Another goroutine of the owner locks while the unlock
				// waits for its reply.
				must(t, h.lock(ctx))
				l, err := h.lease(ctx)
				must(t, err)
				close(g.open)
				if err := <-first; !errors.Is(err, redistest.ErrInjected) {
					t.Fatalf("unlock whose reply is lost = %v, want the injected error", err)
				}
				// The repeat of the unlock whose outcome was unknown.
				if err := h.unlock(ctx); err != nil && !errors.Is(err, dsync.ErrLeaseLost) {
					t.Fatalf("repeated unlock = %v", err)
				}
				other := newClient(t, b).RWMutex(name)
				try := other.TryLock
				if kind.name == "Mutex" {
					try = newClient(t, b).Mutex(name).TryLock
				}
				if ok, err := try(dsync.WithOwner(ctx)); err != nil || ok {
					t.Fatalf("another owner's TryLock while the owner holds a level it took during the unlock whose reply was lost (its Lease done: %v, Err %v) = %v, %v; want false",
						isDone(l), l.Err(), ok, err)
				}
				must(t, h.unlock(ctx))
				checkIs(t, h.unlock(ctx), dsync.ErrNotHeld, "extra unlock = %v, want ErrNotHeld")
			})
		}
	})
}
