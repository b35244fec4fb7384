package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// freeWithin reports how long it takes a fresh client's try to get name
// after the holder released, polling every 20ms up to limit.
func freeWithin(t *testing.T, try func(context.Context) (bool, error), release func(context.Context) error, limit time.Duration) (time.Duration, bool) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < limit {
		ok, err := try(context.Background())
		if err == nil && ok {
			_ = release(context.Background())
			return time.Since(start), true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start), false
}

// waitingKey returns the key where a waiter of kind kn ("mutex", "write",
// "sem", "read") on name takes its place.
func waitingKey(kn, name string) string {
	switch kn {
	case "mutex":
		return mutexKeys(name).Queue
	case "write":
		return rwk(name).WaitingWriters
	case "read":
		return rwk(name).WaitingReaders
	}
	return semKeys(name).Queue
}

// waitPlaced waits until a waiter of kind kn on name has its place.
func waitPlaced(t *testing.T, rdb redis.UniversalClient, kn, name string) {
	t.Helper()
	waitFor(t, 5*time.Second, "the waiter's place", func() bool {
		n, _ := rdb.Exists(context.Background(), waitingKey(kn, name)).Result()
		return n == 1
	})
}

// A waiter whose Client is closed returns ErrClosed; the holder's later
// release must not hand the name to that dead waiter (it "leaves no hold
// behind").
func TestCloseWaiterThenRelease(t *testing.T) {
	kinds := map[string]holdKind{"mutex": mutexHold, "write": writeHold, "sem": semHold(1, 1)}
	for kn, kind := range kinds {
		t.Run(kn, func(t *testing.T) {
			b, ctx, name := realName(t)
			const ttl = 4 * time.Second
			ca := newClient(t, b, dsync.TTL(ttl))
			cb := dsync.New(b.NewClient(t), dsync.TTL(ttl))
			defer cb.Close()
			cc := newClient(t, b, dsync.TTL(ttl))
			ha, hb, hc := kind(ca, name), kind(cb, name), kind(cc, name)
			must(t, ha.lock(ctx))
			ch := async(func() error { return hb.lock(ctx) })
			waitPlaced(t, b.NewClient(t), kn, name)
			start := time.Now()
			cb.Close()
			select {
			case err := <-ch:
				if !errors.Is(err, dsync.ErrClosed) {
					t.Errorf("waiting lock after Close: %v, want ErrClosed", err)
				}
				if d := time.Since(start); d > 400*time.Millisecond {
					t.Errorf("waiting lock returned %v after Close", d)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("waiting lock did not return after Close")
			}
			must(t, ha.unlock(ctx))
			d, ok := freeWithin(t, hc.try, hc.unlock, ttl+2*time.Second)
			if !ok || d > time.Second {
				t.Errorf("name free for another client %v after release (ok=%v), want at once: the closed waiter kept it", d, ok)
			}
		})
	}
}

// A reader waiting behind a writer when its Client is closed: the writer's
// Unlock admits waiting readers "at once"; the closed reader must not be
// admitted as a read holder that blocks writers for its TTL.
func TestCloseWaitingReaderThenRelease(t *testing.T) {
	b, ctx, name := realName(t)
	const ttl = 4 * time.Second
	ca := newClient(t, b, dsync.TTL(ttl))
	cb := dsync.New(b.NewClient(t), dsync.TTL(ttl))
	defer cb.Close()
	cc := newClient(t, b, dsync.TTL(ttl))
	wa, rb, wc := ca.RWMutex(name), cb.RWMutex(name), cc.RWMutex(name)
	must(t, wa.Lock(ctx))
	ch := async(func() error { return rb.RLock(ctx) })
	waitPlaced(t, b.NewClient(t), "read", name)
	cb.Close()
	if err := <-ch; !errors.Is(err, dsync.ErrClosed) {
		t.Errorf("RLock waiting at Close: %v", err)
	}
	must(t, wa.Unlock(ctx))
	d, ok := freeWithin(t, wc.TryLock, wc.Unlock, ttl+2*time.Second)
	if !ok || d > time.Second {
		t.Errorf("writer got in only %v after release (ok=%v): the closed reader was admitted as a holder", d, ok)
	}
}

// The same waiters given up by ctx cancel instead of Close leave nothing
// behind (control for TestCloseWaiterThenRelease).
func TestCancelWaiterThenRelease(t *testing.T) {
	kinds := map[string]holdKind{"mutex": mutexHold, "write": writeHold, "sem": semHold(1, 1)}
	for kn, kind := range kinds {
		t.Run(kn, func(t *testing.T) {
			b, ctx, name := realName(t)
			const ttl = 4 * time.Second
			ca := newClient(t, b, dsync.TTL(ttl))
			cb := newClient(t, b, dsync.TTL(ttl))
			cc := newClient(t, b, dsync.TTL(ttl))
			ha, hb, hc := kind(ca, name), kind(cb, name), kind(cc, name)
			must(t, ha.lock(ctx))
			wctx, cancel := context.WithCancel(ctx)
			ch := async(func() error { return hb.lock(wctx) })
			waitPlaced(t, b.NewClient(t), kn, name)
			cancel()
			<-ch
			must(t, ha.unlock(ctx))
			d, ok := freeWithin(t, hc.try, hc.unlock, ttl+2*time.Second)
			if !ok || d > time.Second {
				t.Errorf("name free only %v after release (ok=%v)", d, ok)
			}
		})
	}
}

// Close while a Lock's first attempt sits on a paused server: the call is
// "in progress" at Close, so it must return ErrClosed, and what the server
// granted it must not stay held for a TTL nobody renews.
func TestCloseDuringAttempt(t *testing.T) {
	kinds := map[string]holdKind{"mutex": mutexHold, "write": writeHold, "read": readHold, "sem": semHold(2, 1)}
	for kn, kind := range kinds {
		for _, withDeadline := range []bool{false, true} {
			sub := kn + "/background"
			if withDeadline {
				sub = kn + "/deadline"
			}
			t.Run(sub, func(t *testing.T) {
				b, _, name := realName(t)
				const ttl = 4 * time.Second
				plain := b.NewClient(t)
				cb := dsync.New(b.NewClient(t), dsync.TTL(ttl))
				defer cb.Close()
				cc := newClient(t, b, dsync.TTL(ttl))
				hb, hc := kind(cb, name), kind(cc, name)
				// warm up the connection and the scripts
				ok, err := hb.try(context.Background())
				must(t, err)
				if !ok {
					t.Fatal("warm-up try failed")
				}
				must(t, hb.unlock(context.Background()))
				lctx := context.Background()
				if withDeadline {
					var cancel context.CancelFunc
					lctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
				}
				must(t, plain.Do(context.Background(), "CLIENT", "PAUSE", "700", "ALL").Err())
				ch := async(func() error { return hb.lock(lctx) })
				time.Sleep(200 * time.Millisecond)
				closed := make(chan struct{})
				go func() { cb.Close(); close(closed) }()
				var lerr error
				select {
				case lerr = <-ch:
				case <-time.After(8 * time.Second):
					t.Fatal("lock did not return")
				}
				<-closed
				if !errors.Is(lerr, dsync.ErrClosed) {
					l, lerr2 := hb.lease(context.Background())
					var le error
					if l != nil {
						le = l.Err()
					}
					t.Errorf("lock in flight at Close returned %v, want ErrClosed (Lease: %v, lease.Err %v)", lerr, lerr2, le)
				}
				if kn == "read" || kn == "sem" {
					// size 2 / readers share: probe with a writer-like exclusive
					return
				}
				d, ok := freeWithin(t, hc.try, hc.unlock, ttl+2*time.Second)
				if !ok || d > time.Second {
					t.Errorf("name free for another client only %v after Close (ok=%v): the in-flight grant stayed held, unrenewed, for its TTL", d, ok)
				}
			})
		}
	}
}

// A Lock cancelled while the server holds its attempt returns ctx.Err() and
// "leaves no hold behind, also when the server took the lock but the reply
// was lost". Close right after it: is the clean-up done, or is the grant
// left for its TTL?
func TestCloseAfterCancelledLock(t *testing.T) { cancelledLockThenFree(t, true) }

// The same without Close.
func TestCancelledLockPausedServer(t *testing.T) { cancelledLockThenFree(t, false) }

func cancelledLockThenFree(t *testing.T, closeIt bool) {
	kinds := map[string]holdKind{"mutex": mutexHold, "write": writeHold, "sem": semHold(1, 1)}
	for kn, kind := range kinds {
		t.Run(kn, func(t *testing.T) {
			b, _, name := realName(t)
			const ttl = 5 * time.Second
			plain := b.NewClient(t)
			c := dsync.New(b.NewClient(t), dsync.TTL(ttl))
			defer c.Close()
			cc := newClient(t, b, dsync.TTL(ttl))
			h, hc := kind(c, name), kind(cc, name)
			ok, err := h.try(context.Background())
			must(t, err)
			if !ok {
				t.Fatal("warm-up")
			}
			must(t, h.unlock(context.Background()))
			must(t, plain.Do(context.Background(), "CLIENT", "PAUSE", "800", "WRITE").Err())
			pauseStart := time.Now()
			lctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			err = h.lock(lctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("lock = %v", err)
			}
			if closeIt {
				c.Close()
			}
			time.Sleep(time.Until(pauseStart.Add(900 * time.Millisecond)))
			d, ok := freeWithin(t, hc.try, hc.unlock, ttl+2*time.Second)
			if !ok || d > time.Second {
				t.Errorf("name free only after %v (ok=%v): the cancelled Lock's grant stayed held for its TTL once Close cancelled the clean-up", d, ok)
			}
		})
	}
}

// Close with nothing but a renewal in flight to a paused server, on a
// go-redis client whose ReadTimeout is long: Close must still wait "5 s at
// most for those sent to a server that does not answer".
func TestCloseRenewalInFlightLongReadTimeout(t *testing.T) {
	b, ctx, name := realName(t)
	plain := b.NewClient(t)
	rdb := redis.NewClient(&redis.Options{Addr: b.Addrs[0], ReadTimeout: 20 * time.Second})
	defer rdb.Close()
	c := dsync.New(rdb, dsync.TTL(600*time.Millisecond))
	defer c.Close()
	m := c.Mutex(name)
	must(t, m.Lock(ctx))
	must(t, plain.Do(ctx, "CLIENT", "PAUSE", "12000", "ALL").Err())
	time.Sleep(500 * time.Millisecond) // a renewal (every 200 ms) is now held by the server
	start := time.Now()
	done := make(chan struct{})
	go func() { c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
	}
	d := time.Since(start)
	t.Logf("Close took %v", d)
	if d > 5*time.Second+500*time.Millisecond {
		t.Errorf("Close took %v with a renewal in flight to a paused server, want ≤ 5 s", d)
	}
	<-done
	time.Sleep(time.Until(start.Add(12 * time.Second)))
}

// Close waits for the clean-up of the calls it ends: a waiting call that
// Close ends drops its queue place (its undo) before Close returns, also
// when the undo fails on the way and is tried again, so that nothing of
// the Client runs, and nothing of the call is left in Redis, once Close
// has returned.
func TestCloseWaitsForTheCleanUpOfTheCallsItEnds(t *testing.T) {
	kinds := []struct {
		kn, undo string
		kind     holdKind
	}{
		{"mutex", "mutex_unlock", mutexHold},
		{"write", "rwmutex_unlock", writeHold},
		{"sem", "semaphore_abandon", semHold(1, 1)},
	}
	for _, k := range kinds {
		t.Run(k.kn, func(t *testing.T) {
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				undo := scriptFaults(k.undo)
				ha := k.kind(newClient(t, b), name)
				cb, _ := hookedClient(t, b, undo)
				hb := k.kind(cb, name)
				must(t, ha.lock(ctx))
				undo.FailNext(3, errors.New("connection reset"))
				ch := async(func() error { return hb.lock(ctx) })
				rdb := b.NewClient(t)
				waitPlaced(t, rdb, k.kn, name)
				cb.Close()
				// What Redis holds when Close returns.
				n, err := rdb.Exists(ctx, waitingKey(k.kn, name)).Result()
				must(t, err)
				if tries := undo.Injected(); n != 0 || tries != 3 {
					t.Errorf("when Close returned: the closed waiter's place there: %v; its undo failed %d times, want 3 and then done", n == 1, tries)
				}
				select {
				case err := <-ch:
					mustIs(t, err, dsync.ErrClosed, "the waiting call Close ended")
				case <-time.After(5 * time.Second):
					t.Fatal("the waiting call did not return after Close")
				}
			})
		})
	}
}

// slowScript holds each run of one script for d before sending it: a
// slow network, on the way there only.
type slowScript struct {
	sha string
	d   time.Duration
}

func (s slowScript) slow(cmd redis.Cmder) {
	if a := cmd.Args(); cmd.Name() == "evalsha" && len(a) > 1 && a[1] == s.sha {
		time.Sleep(s.d)
	}
}

func (s slowScript) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s slowScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.slow(cmd)
		return next(ctx, cmd)
	}
}

func (s slowScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			s.slow(c)
		}
		return next(ctx, cmds)
	}
}

// The same for a Quorum: a waiting RWMutex Lock (a writer keeps a waiting
// place on the masters that refused it) that Close ends drops its places
// on every master before Close returns, also when the undo is slow to
// get there. (A member's undo is made once: see memberUndo.)
func TestQuorumCloseWaitsForTheCleanUpOfTheCallsItEnds(t *testing.T) {
	ctx, name := ctxT(t), redistest.Key(t)
	_, rdbs := masters(t, 3)
	holder := newQuorum(t, rdbs)
	var waiterRdbs []redis.UniversalClient
	for _, r := range rdbs {
		w := redis.NewClient(r.(*redis.Client).Options())
		t.Cleanup(func() { _ = w.Close() })
		w.AddHook(slowScript{sha: lua.Script("rwmutex_unlock").Hash(), d: 300 * time.Millisecond})
		waiterRdbs = append(waiterRdbs, w)
	}
	waiter := dsync.NewQuorum(waiterRdbs)
	t.Cleanup(func() { waiter.Close() })
	must(t, holder.RWMutex(name).Lock(ctx))
	ch := async(func() error { return waiter.RWMutex(name).Lock(ctx) })
	places := waitingKey("write", name)
	waitFor(t, 10*time.Second, "the waiter's place on every master", func() bool {
		for _, r := range rdbs {
			if n, err := r.Exists(ctx, places).Result(); err != nil || n != 1 {
				return false
			}
		}
		return true
	})
	waiter.Close()
	for i, r := range rdbs {
		n, err := r.Exists(ctx, places).Result()
		must(t, err)
		if n != 0 {
			t.Errorf("master %d when Close returned: the closed waiter's place is there", i)
		}
	}
	select {
	case err := <-ch:
		mustIs(t, err, dsync.ErrClosed, "the waiting call Close ended")
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting call did not return after Close")
	}
}
