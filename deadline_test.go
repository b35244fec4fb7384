package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// deadAddr returns a loopback address where nothing listens: connections
// are refused.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// silentAddr returns a loopback address that accepts connections and never
// answers, as a server that hangs or a network that drops every packet.
func silentAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String()
}

// With Redis unreachable, every call that takes a hold returns about when
// its ctx ends, as a plain go-redis call on the same client does: the
// clean-up of a failed attempt may outlive the call, but the call does not
// wait for it (DESIGN, Deadlines). Close then stops that clean-up.
func TestDeadlineWithRedisDown(t *testing.T) {
	const deadline = 300 * time.Millisecond
	// A loaded machine under the race detector may be late by far more
	// than a few ms; the defect this guards against cost seconds.
	const slack = 400 * time.Millisecond
	for _, down := range []struct {
		name string
		opts func(t *testing.T) *redis.Options
	}{
		{"refused", func(t *testing.T) *redis.Options { return &redis.Options{Addr: deadAddr(t)} }},
		{"silent", func(t *testing.T) *redis.Options {
			return &redis.Options{Addr: silentAddr(t), ContextTimeoutEnabled: true}
		}},
		// go-redis's defaults: it reads until its ReadTimeout (3 s),
		// whatever the ctx says; the call must not.
		{"silent, go-redis defaults", func(t *testing.T) *redis.Options { return &redis.Options{Addr: silentAddr(t)} }},
	} {
		t.Run(down.name, func(t *testing.T) {
			rdb := redis.NewClient(down.opts(t))
			t.Cleanup(func() { rdb.Close() })
			c := dsync.New(rdb)
			name := "deadline"
			m, rw, s, o := c.Mutex(name), c.RWMutex(name), c.Semaphore(name, 2), c.Once(name)
			calls := []struct {
				name string
				f    func(ctx context.Context) error
			}{
				{"plain GET", func(ctx context.Context) error { return rdb.Get(ctx, "x").Err() }},
				{"Mutex.Lock", m.Lock},
				{"Mutex.TryLock", func(ctx context.Context) error { _, err := m.TryLock(ctx); return err }},
				{"Mutex.Lock with owner", func(ctx context.Context) error { return m.Lock(dsync.WithOwner(ctx)) }},
				{"RWMutex.Lock", rw.Lock},
				{"RWMutex.RLock", rw.RLock},
				{"RWMutex.TryLock", func(ctx context.Context) error { _, err := rw.TryLock(ctx); return err }},
				{"RWMutex.TryRLock", func(ctx context.Context) error { _, err := rw.TryRLock(ctx); return err }},
				{"Semaphore.Acquire", func(ctx context.Context) error { return s.Acquire(ctx, 1) }},
				{"Semaphore.TryAcquire", func(ctx context.Context) error { _, err := s.TryAcquire(ctx, 1); return err }},
				{"Once.Do", func(ctx context.Context) error {
					return o.Do(ctx, func(context.Context) error { return errors.New("f ran with Redis down") })
				}},
				{"Once.Done", func(ctx context.Context) error { _, err := o.Done(ctx); return err }},
				{"Once.Reset", o.Reset},
			}
			for _, call := range calls {
				if call.name == "plain GET" && down.name == "silent, go-redis defaults" {
					continue // go-redis itself waits for its ReadTimeout
				}
				// A deadline, and a cancel of a ctx without one (which
				// go-redis does not see while it reads a reply).
				for _, end := range []string{"deadline", "cancel"} {
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					if end == "cancel" {
						if call.name == "plain GET" {
							continue
						}
						ctx, cancel = context.WithCancel(context.Background())
						time.AfterFunc(deadline, cancel)
					}
					start := time.Now()
					err := call.f(ctx)
					took := time.Since(start)
					cancel()
					if err == nil {
						t.Errorf("%s with Redis down returned nil", call.name)
					} else if !errors.Is(err, ctx.Err()) && down.name != "refused" {
						t.Errorf("%s ended by a %s returned %v, want the ctx's error", call.name, end, err)
					}
					if took > deadline+slack {
						t.Errorf("%s with a %v %s returned after %v (%v)", call.name, deadline, end, took.Round(time.Millisecond), err)
					}
				}
			}
			// Close waits for the clean-ups left to the background; one
			// whose command was sent to a silent server waits for its
			// reply until its own deadline (5 s), as go-redis reads cannot
			// be interrupted.
			start := time.Now()
			c.Close()
			if took := time.Since(start); took > 5*time.Second+slack {
				t.Errorf("Close took %v with clean-ups pending against a dead server", took.Round(time.Millisecond))
			}
		})
	}
}

// The tests of calls whose ctx ends while the server holds their command
// cancel cancelAfter into a pause of pauseFor, and allow slack for a
// loaded machine under -race.
const (
	cancelAfter = 300 * time.Millisecond
	slack       = 400 * time.Millisecond
	pauseFor    = 2 * time.Second
)

// cancelledInPause runs call (what) with a ctx of parent that is cancelled
// cancelAfter into it, while the server holds the command, and checks that
// it returns context.Canceled then, allowing slack.
func cancelledInPause(t *testing.T, parent context.Context, what string, call func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(parent)
	time.AfterFunc(cancelAfter, cancel)
	start := time.Now()
	err := call(ctx)
	took := time.Since(start)
	cancel()
	if !errors.Is(err, context.Canceled) {
		t.Errorf("%s cancelled while the server held it returned %v, want context.Canceled", what, err)
	}
	if took > cancelAfter+slack {
		t.Errorf("%s cancelled after %v returned after %v", what, cancelAfter, took.Round(time.Millisecond))
	}
}

// A pausable is a private real server whose writes a test pauses (CLIENT
// PAUSE), as a busy server or a network that delays replies would hold them.
type pausable struct {
	s     *redistest.Server
	admin *redis.Client
}

func newPausable(t *testing.T) *pausable {
	s := redistest.StartStandalone(t)
	return &pausable{s: s, admin: s.Client(t)}
}

// client returns a Client over a go-redis client with go-redis's defaults
// (which read until ReadTimeout whatever the ctx says), closed at t.Cleanup.
func (p *pausable) client(t *testing.T, opts ...dsync.Option) *dsync.Client {
	rdb := redis.NewClient(&redis.Options{Addr: p.s.Addr()})
	c := dsync.New(rdb, opts...)
	t.Cleanup(func() { c.Close(); rdb.Close() })
	return c
}

// pause holds every write for pauseFor and returns when it began, about.
func (p *pausable) pause(t *testing.T) time.Time {
	if err := p.admin.Do(context.Background(), "client", "pause", pauseFor.Milliseconds(), "write").Err(); err != nil {
		t.Error(err)
	}
	return time.Now()
}

// A call whose ctx is cancelled while the server holds its command (CLIENT
// PAUSE: a server busy, or a network that delays replies) returns at the
// cancel, with go-redis's default options, which read until ReadTimeout
// whatever the ctx says; and once the server runs the command it gave up
// on, nothing is left behind: the name is free at once for another
// process (DESIGN, Deadlines and Waiting).
func TestCancelWhileServerHoldsCommand(t *testing.T) {
	ps := newPausable(t)
	c, other := ps.client(t), ps.client(t)
	ran := false
	ops := []struct {
		name string
		call func(c *dsync.Client, ctx context.Context, name string) error
		// free takes the name in other at once, and releases it.
		free func(c *dsync.Client, ctx context.Context, name string) (bool, error)
	}{
		{"Mutex.Lock", func(c *dsync.Client, ctx context.Context, n string) error { return c.Mutex(n).Lock(ctx) },
			func(c *dsync.Client, ctx context.Context, n string) (bool, error) {
				ok, err := c.Mutex(n).TryLock(ctx)
				return ok, err
			}},
		{"RWMutex.Lock", func(c *dsync.Client, ctx context.Context, n string) error { return c.RWMutex(n).Lock(ctx) },
			func(c *dsync.Client, ctx context.Context, n string) (bool, error) { return c.RWMutex(n).TryLock(ctx) }},
		{"RWMutex.RLock", func(c *dsync.Client, ctx context.Context, n string) error { return c.RWMutex(n).RLock(ctx) },
			func(c *dsync.Client, ctx context.Context, n string) (bool, error) { return c.RWMutex(n).TryLock(ctx) }},
		{"Semaphore.Acquire", func(c *dsync.Client, ctx context.Context, n string) error { return c.Semaphore(n, 2).Acquire(ctx, 2) },
			func(c *dsync.Client, ctx context.Context, n string) (bool, error) {
				return c.Semaphore(n, 2).TryAcquire(ctx, 2)
			}},
		{"Once.Do", func(c *dsync.Client, ctx context.Context, n string) error {
			return c.Once(n).Do(ctx, func(context.Context) error { ran = true; return nil })
		}, func(c *dsync.Client, ctx context.Context, n string) (bool, error) {
			// Another process's Do runs f at once: no run lease of the
			// cancelled call is left to wait out.
			done := false
			err := c.Once(n).Do(ctx, func(context.Context) error { done = true; return nil })
			return done, err
		}},
	}
	for i, op := range ops {
		name := fmt.Sprintf("%s-%d", redistest.Key(t), i)
		// Warm up: a connection in the pool, the scripts loaded.
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := op.free(c, wctx, name+"-warm"); err != nil {
			t.Fatalf("%s: warm-up: %v", op.name, err)
		}
		wcancel()
		paused := ps.pause(t)
		cancelledInPause(t, context.Background(), op.name, func(ctx context.Context) error { return op.call(c, ctx, name) })
		// After the pause the server runs what the call sent, and its
		// clean-up.
		time.Sleep(time.Until(paused.Add(pauseFor)))
		dsync.WaitCleanups(c)
		fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok, err := op.free(other, fctx, name)
		fcancel()
		if err != nil || !ok {
			t.Errorf("%s: after the pause another process could not take the name at once (%v, %v): the cancelled call left something behind", op.name, ok, err)
		}
	}
	if ran {
		t.Error("Once.Do ran f for a call that was cancelled before its script ran")
	}
}

// An Unlock or Release whose ctx ends while the server holds its command
// returns at once with the ctx's error, and the release completes in the
// background as if the caller had waited: once the server answers, the
// name is free for another process and the holder's lease ended released,
// not lost. Under client reentrancy, a Lock of the owner made meanwhile
// waits for that release and takes the name afresh, as Redis then shows.
func TestReleaseCancelledWhileServerHoldsIt(t *testing.T) {
	ps := newPausable(t)
	other := ps.client(t)
	type prim struct {
		lock   func(ctx context.Context) error
		unlock func(ctx context.Context) error
		lease  func(ctx context.Context) (*dsync.Lease, error)
		// free takes the name in other at once, reporting whether it could.
		free func(ctx context.Context) (bool, error)
	}
	kinds := []struct {
		name string
		mk   func(c *dsync.Client, name string) prim
	}{
		{"Mutex", func(c *dsync.Client, n string) prim {
			m, o := c.Mutex(n), other.Mutex(n)
			return prim{m.Lock, m.Unlock, m.Lease, o.TryLock}
		}},
		{"RWMutex write", func(c *dsync.Client, n string) prim {
			rw, o := c.RWMutex(n), other.RWMutex(n)
			return prim{rw.Lock, rw.Unlock, rw.Lease, o.TryLock}
		}},
		{"RWMutex read", func(c *dsync.Client, n string) prim {
			rw, o := c.RWMutex(n), other.RWMutex(n)
			return prim{rw.RLock, rw.RUnlock, rw.RLease, o.TryLock}
		}},
		{"Semaphore", func(c *dsync.Client, n string) prim {
			sem, o := c.Semaphore(n, 2), other.Semaphore(n, 2)
			return prim{
				func(ctx context.Context) error { return sem.Acquire(ctx, 2) },
				func(ctx context.Context) error { return sem.Release(ctx, 2) },
				sem.Lease,
				func(ctx context.Context) (bool, error) { return o.TryAcquire(ctx, 2) },
			}
		}},
	}
	modes := []struct {
		name  string
		local bool
		ctx   func() context.Context
	}{
		{"handle", false, context.Background},
		{"owner", false, func() context.Context { return dsync.WithOwner(context.Background()) }},
		{"owner, client reentrancy", true, func() context.Context { return dsync.WithOwner(context.Background()) }},
	}
	i := 0
	for _, kind := range kinds {
		for _, mode := range modes {
			if mode.local && kind.name == "Semaphore" {
				continue // no client reentrancy for a Semaphore
			}
			t.Run(kind.name+"/"+mode.name, func(t *testing.T) {
				i++
				var opts []dsync.Option
				if mode.local {
					opts = append(opts, dsync.ClientReentrancy())
				}
				c := ps.client(t, opts...)
				p := kind.mk(c, fmt.Sprintf("%s-%d", redistest.Key(t), i))
				octx := mode.ctx()
				lctx, lcancel := context.WithTimeout(octx, 10*time.Second)
				defer lcancel()
				must(t, p.lock(lctx))
				lease, err := p.lease(lctx)
				if err != nil {
					t.Fatal(err)
				}
				paused := ps.pause(t)
				cancelledInPause(t, octx, "release", p.unlock)
				if mode.local {
					// The owner locks again while its release is pending:
					// not a re-entry of the hold being released.
					if err := p.lock(lctx); err != nil {
						t.Fatalf("owner's Lock during its pending release: %v", err)
					}
					if time.Now().Before(paused.Add(pauseFor - 100*time.Millisecond)) {
						t.Errorf("owner's Lock returned %v into the pause: it re-entered a hold being released", time.Since(paused).Round(time.Millisecond))
					}
					fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
					ok, err := p.free(fctx)
					fcancel()
					if err != nil || ok {
						t.Errorf("after the owner locked again another process took the name (%v, %v)", ok, err)
					}
					if err := p.unlock(lctx); err != nil {
						t.Errorf("Unlock of the new hold: %v", err)
					}
				} else {
					time.Sleep(time.Until(paused.Add(pauseFor)))
				}
				dsync.WaitCleanups(c)
				waitDone(t, lease, 5*time.Second, "(the lease of the released hold)")
				if err := lease.Err(); err != nil {
					t.Errorf("the released hold's lease reports %v, want nil (released, not lost)", err)
				}
				fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
				ok, err := p.free(fctx)
				fcancel()
				if err != nil || !ok {
					t.Errorf("after the release another process could not take the name (%v, %v)", ok, err)
				}
			})
		}
	}
}

// A Once.Do whose ctx ends after f returned, while the server holds the
// command that marks the Once done, returns at the cancel with ctx's
// error; the mark completes in the background, so f never runs again.
func TestOnceDoCancelledWhileMarkingDone(t *testing.T) {
	ps := newPausable(t)
	c := ps.client(t)
	name := redistest.Key(t)
	// Warm up: a connection in the pool, the scripts loaded.
	must(t, c.Once(name+"-warm").Do(context.Background(), func(context.Context) error { return nil }))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var paused, start time.Time
	err := c.Once(name).Do(ctx, func(context.Context) error {
		paused = ps.pause(t)
		time.AfterFunc(cancelAfter, cancel)
		start = time.Now()
		return nil
	})
	took := time.Since(start)
	if paused.IsZero() {
		t.Fatalf("Do = %v before f paused the server", err)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Do cancelled while its done mark was held = %v, want context.Canceled", err)
	}
	if took > cancelAfter+slack {
		t.Errorf("Do cancelled %v after f returned came back after %v", cancelAfter, took.Round(time.Millisecond))
	}
	time.Sleep(time.Until(paused.Add(pauseFor)))
	dsync.WaitCleanups(c)
	ran := false
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	must(t, ps.client(t).Once(name).Do(dctx, func(context.Context) error { ran = true; return nil }))
	if ran {
		t.Error("f ran again: the done mark of the cancelled call was lost")
	}
}

// A run of Once.Do whose ctx ended while f ran, with the server holding
// commands (CLIENT PAUSE, 2 s): f returns, or panics, once its ctx ends,
// and Do returns (or the panic goes on) then, not when the server answers
// the end of the run, which completes in the background: a failed run
// frees the name for the next call, a run that succeeded marks the Once
// done (DESIGN, Deadlines).
func TestOnceDoReturnsAtItsDeadlineWhileServerHoldsTheEnd(t *testing.T) {
	ps := newPausable(t)
	c := ps.client(t)
	name := redistest.Key(t)
	// Warm up: a connection in the pool, the scripts loaded.
	must(t, c.Once(name+"-warm").Do(context.Background(), func(context.Context) error { return nil }))
	const deadline = 300 * time.Millisecond
	for _, end := range []string{"fails", "succeeds", "panics"} {
		t.Run(end, func(t *testing.T) {
			n := name + "-" + end
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			var paused time.Time
			start := time.Now()
			var err error
			var p any
			func() {
				defer func() { p = recover() }()
				err = c.Once(n).Do(ctx, func(fctx context.Context) error {
					paused = ps.pause(t)
					<-fctx.Done()
					switch end {
					case "fails":
						return fctx.Err()
					case "panics":
						panic("f panicked")
					}
					return nil
				})
			}()
			took := time.Since(start)
			if paused.IsZero() {
				t.Fatalf("Do = %v before f paused the server", err)
			}
			if end == "panics" && p != "f panicked" {
				t.Errorf("recovered %v, want f's panic", p)
			}
			if end != "panics" && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Do = %v, want the ctx's error", err)
			}
			if took > deadline+slack {
				t.Errorf("Do with a %v deadline, f ending at it, came back after %v (%v, %v)", deadline, took.Round(time.Millisecond), err, p)
			}
			time.Sleep(time.Until(paused.Add(pauseFor)))
			dsync.WaitCleanups(c)
			ran := false
			dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer dcancel()
			must(t, ps.client(t).Once(n).Do(dctx, func(context.Context) error { ran = true; return nil }))
			if ran == (end == "succeeds") {
				t.Errorf("after the pause, another process's Do ran f: %v; want %v", ran, end != "succeeds")
			}
		})
	}
}

// An Unlock, RUnlock or Release called with a ctx that has already ended,
// while the server holds commands, returns within a few ms with the ctx's
// error; the release completes in the background once the server answers.
func TestReleaseWithEndedCtxWhileServerHoldsIt(t *testing.T) {
	ps := newPausable(t)
	c, other := ps.client(t), ps.client(t)
	name := redistest.Key(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, rw, s := c.Mutex(name), c.RWMutex(name), c.Semaphore(name, 1)
	must(t, m.Lock(ctx))
	must(t, rw.RLock(ctx))
	must(t, s.Acquire(ctx, 1))
	ended, end := context.WithCancel(context.Background())
	end()
	paused := ps.pause(t)
	for what, release := range map[string]func() error{
		"Mutex.Unlock":      func() error { return m.Unlock(ended) },
		"RWMutex.RUnlock":   func() error { return rw.RUnlock(ended) },
		"Semaphore.Release": func() error { return s.Release(ended, 1) },
	} {
		start := time.Now()
		err := release()
		if took := time.Since(start); took > slack {
			t.Errorf("%s with an ended ctx, the server paused: returned after %v (%v)", what, took.Round(time.Millisecond), err)
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with an ended ctx, the server paused: %v, want context.Canceled", what, err)
		}
	}
	time.Sleep(time.Until(paused.Add(pauseFor)))
	dsync.WaitCleanups(c)
	for what, try := range map[string]func() (bool, error){
		"Mutex":     func() (bool, error) { return other.Mutex(name).TryLock(ctx) },
		"RWMutex":   func() (bool, error) { return other.RWMutex(name).TryLock(ctx) },
		"Semaphore": func() (bool, error) { return other.Semaphore(name, 1).TryAcquire(ctx, 1) },
	} {
		if ok, err := try(); !ok || err != nil {
			t.Errorf("%s after the pause: another process's try = %v, %v; the release did not complete", what, ok, err)
		}
	}
}
