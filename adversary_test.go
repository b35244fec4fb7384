package dsync_test

import (
	"bytes"
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
	"github.com/dsync-go/dsync/lua"
)

// Cases taken from the suites of sync, golang.org/x/sync/semaphore,
// redislock, redsync and Redisson, adapted to dsync's API, and sentences of
// the design's Semantics section that no other test states on its own.
// Each asserts what Redis holds where it can.

// nameKeys returns every key of the primitives called name (default
// prefix) on b, scanning every master of a cluster.
func nameKeys(t *testing.T, b redistest.Backend, name string) []string {
	t.Helper()
	ks, err := nemScan(context.Background(), b.NewClient(t), "dsync:{"+name+"}*", 1000)
	must(t, err)
	return ks
}

// assertAllExpire checks that every key of name on b has an expiry within
// max, but for the keys in except.
func assertAllExpire(t *testing.T, b redistest.Backend, name string, max time.Duration, except ...string) []string {
	t.Helper()
	rdb := b.NewClient(t)
	ks := nameKeys(t, b, name)
	for _, k := range ks {
		skip := false
		for _, e := range except {
			skip = skip || k == e
		}
		if skip {
			continue
		}
		ttl, err := rdb.PTTL(context.Background(), k).Result()
		must(t, err)
		if ttl <= 0 || ttl > max {
			t.Errorf("key %s: PTTL %v, want an expiry within %v", k, ttl, max)
		}
	}
	return ks
}

// eachMode runs f with script reentrancy (the default) and with
// ClientReentrancy: the options for the owner's Client.
func eachMode(t *testing.T, f func(t *testing.T, local bool, opts ...dsync.Option)) {
	t.Run("script", func(t *testing.T) { f(t, false) })
	t.Run("client", func(t *testing.T) { f(t, true, dsync.ClientReentrancy()) })
}

// waitZCard waits until the zset key (a queue, the waiting writers) has
// at least n members.
func waitZCard(t *testing.T, rdb redis.UniversalClient, key string, n int64, what string) {
	t.Helper()
	waitFor(t, 10*time.Second, what, func() bool {
		got, _ := rdb.ZCard(context.Background(), key).Result()
		return got >= n
	})
}

// x/sync/semaphore's TestWeightedTryAcquire on one handle, which holds for
// all its goroutines as a Weighted does.
func TestAdvSemaphoreTryAcquireSequence(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		s := newClient(t, b).Semaphore(name, 2)
		try := func(n int64) bool {
			ok, err := s.TryAcquire(ctx, n)
			must(t, err)
			return ok
		}
		var tries []bool
		must(t, s.Acquire(ctx, 1))
		tries = append(tries, try(1))
		tries = append(tries, try(1))
		must(t, s.Release(ctx, 2))
		tries = append(tries, try(1))
		must(t, s.Acquire(ctx, 1))
		tries = append(tries, try(1))
		want := []bool{true, false, true, false}
		for i := range want {
			if tries[i] != want[i] {
				t.Fatalf("tries = %v, want %v", tries, want)
			}
		}
		if n, _ := b.NewClient(t).HGet(ctx, semKeys(name).State, ":used").Int(); n != 2 {
			t.Errorf(":used in Redis = %d, want 2", n)
		}
		must(t, s.Release(ctx, 2))
		assertNoSemKeys(t, b, name)
	})
}

// x/sync's Acquire fails on a ctx that is already done, even with permits
// free, and leaves the semaphore unchanged; so does dsync's ("If ctx is
// already done, Acquire returns its error without trying").
func TestAdvSemaphoreAcquireDoneCtxTakesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		name := redistest.Key(t)
		counter := &redistest.Counter{}
		c, _ := hookedClient(t, b, counter)
		s := c.Semaphore(name, 3)
		done, cancel := context.WithCancel(context.Background())
		cancel()
		for _, ctx := range []context.Context{done, dsync.WithOwner(done)} {
			if err := s.Acquire(ctx, 1); !errors.Is(err, context.Canceled) {
				t.Errorf("Acquire with a done ctx = %v, want context.Canceled", err)
			}
		}
		if n := counter.RoundTrips(); n != 0 {
			t.Errorf("Acquire with a done ctx sent %d commands, want 0", n)
		}
		if _, err := s.Lease(context.Background()); !errors.Is(err, dsync.ErrNotHeld) {
			t.Errorf("Lease after a refused Acquire = %v, want ErrNotHeld", err)
		}
		ok, err := newClient(t, b).Semaphore(name, 3).TryAcquire(ctxT(t), 3)
		if !ok || err != nil {
			t.Fatalf("TryAcquire(3) after = %v, %v; want all permits free", ok, err)
		}
	})
}

// x/sync's TestLargeAcquireDoesntStarve: goroutines sharing permits keep
// releasing and taking one again while a large Acquire waits; the large
// one gets in. Once through one shared handle (one holder, as one Weighted),
// once through a handle per goroutine.
func TestAdvSemaphoreLargeAcquireDoesntStarve(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, shared := range []bool{true, false} {
			name := redistest.Key(t)
			ctx := ctxT(t)
			c := newClient(t, b)
			const n = 3
			big := c.Semaphore(name, n)
			handle := func() *dsync.Semaphore {
				if shared {
					return big
				}
				return c.Semaphore(name, n)
			}
			var running atomic.Bool
			running.Store(true)
			var wg sync.WaitGroup
			for i := 0; i < n; i++ {
				s := handle()
				must(t, s.Acquire(ctx, 1))
				wg.Add(1)
				go func() {
					defer wg.Done()
					for k := 0; running.Load() && k < 10000; k++ {
						time.Sleep(time.Millisecond)
						if err := s.Release(ctx, 1); err != nil {
							t.Errorf("shared=%v Release: %v", shared, err)
							return
						}
						if err := s.Acquire(ctx, 1); err != nil {
							t.Errorf("shared=%v Acquire: %v", shared, err)
							return
						}
					}
					if err := s.Release(ctx, 1); err != nil {
						t.Errorf("shared=%v last Release: %v", shared, err)
					}
				}()
			}
			bigCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
			var s *dsync.Semaphore
			if shared {
				s = big
			} else {
				s = c.Semaphore(name, n)
			}
			err := s.Acquire(bigCtx, n)
			cancel()
			running.Store(false)
			if err != nil {
				t.Errorf("shared=%v: Acquire(%d) while others churn = %v, want nil (starved)", shared, n, err)
			} else {
				must(t, s.Release(ctx, n))
			}
			wg.Wait()
			assertNoSemKeys(t, b, name)
		}
	})
}

// sync's TestMutexFairness on one handle shared by two goroutines: one
// locks and unlocks in a loop, the other must still get in 10 times.
func TestAdvMutexSharedHandleFairness(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		mu := newClient(t, b).Mutex(redistest.Key(t))
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			untilClosed(stop, 100000, func() bool {
				if err := mu.Lock(ctx); err != nil {
					t.Error(err)
					return false
				}
				time.Sleep(100 * time.Microsecond)
				if err := mu.Unlock(ctx); err != nil {
					t.Error(err)
					return false
				}
				return true
			})
		}()
		done := make(chan error, 1)
		go func() {
			for i := 0; i < 10; i++ {
				time.Sleep(100 * time.Microsecond)
				if err := mu.Lock(ctx); err != nil {
					done <- err
					return
				}
				if err := mu.Unlock(ctx); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		recvNil(t, done, 20*time.Second, "the second goroutine could not lock 10 times in 20 s")
		close(stop)
		wg.Wait()
	})
}

// sync's TestTryLock: TryLock through the handle that holds the lock
// reports false at once (it neither waits nor re-enters), and true once
// unlocked.
func TestAdvMutexTryLockOnHeldHandle(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		mu := newClient(t, b).Mutex(name)
		if ok, err := mu.TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock = %v, %v; want true", ok, err)
		}
		res := make(chan bool, 1)
		go func() {
			ok, err := mu.TryLock(ctx)
			if err != nil {
				t.Error(err)
			}
			res <- ok
		}()
		select {
		case ok := <-res:
			if ok {
				t.Fatal("TryLock on the handle's own hold = true, want false")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("TryLock on a held handle blocked")
		}
		if n, _ := b.NewClient(t).Exists(ctx, mutexKeys(name).Lock).Result(); n != 1 {
			t.Fatal("the hold is gone after a refused TryLock")
		}
		must(t, mu.Unlock(ctx))
		mustIs(t, mu.Unlock(ctx), dsync.ErrNotHeld, "second Unlock = %v, want ErrNotHeld")
		if ok, err := mu.TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock after Unlock = %v, %v; want true", ok, err)
		}
		must(t, mu.Unlock(ctx))
		assertNoLockKeys(t, b, name)
	})
}

// Redisson's testUnlockFail and redsync's foreign unlock: an Unlock by an
// owner (or handle) that does not hold the lock returns ErrNotHeld and
// leaves the hold as it was.
func TestAdvMutexForeignUnlockKeepsHold(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		octx := dsync.WithOwner(ctx)
		m := c.Mutex(name)
		l := lockLease(t, octx, m)
		rdb := b.NewClient(t)
		before, err := rdb.HGetAll(ctx, mutexKeys(name).Lock).Result()
		must(t, err)
		for what, f := range map[string]func() error{
			"never-locked handle":             func() error { return c.Mutex(name).Unlock(ctx) },
			"same handle, no owner":           func() error { return m.Unlock(ctx) },
			"same handle, another owner":      func() error { return m.Unlock(dsync.WithOwner(ctx)) },
			"other client, another owner":     func() error { return newClient(t, b).Mutex(name).Unlock(dsync.WithOwner(ctx)) },
			"other client, no owner":          func() error { return newClient(t, b).Mutex(name).Unlock(ctx) },
			"another name, the holding owner": func() error { return c.Mutex(name + "-other").Unlock(octx) },
		} {
			checkIs(t, f(), dsync.ErrNotHeld, what+": Unlock = %v, want ErrNotHeld")
		}
		after, err := rdb.HGetAll(ctx, mutexKeys(name).Lock).Result()
		must(t, err)
		if len(after) != len(before) || after[dsync.OwnerToken(octx)] != "1" {
			t.Errorf("lock hash after foreign unlocks = %v, want %v", after, before)
		}
		if l.Err() != nil {
			t.Errorf("Lease.Err = %v, want nil", l.Err())
		}
		// Redisson's isHeldByCurrentThread: only the owner sees a Lease.
		for what, lctx := range map[string]context.Context{"another owner": dsync.WithOwner(ctx), "no owner": ctx} {
			if _, err := m.Lease(lctx); !errors.Is(err, dsync.ErrNotHeld) {
				t.Errorf("Lease for %s = %v, want ErrNotHeld", what, err)
			}
		}
		if ok, _ := newClient(t, b).Mutex(name).TryLock(ctx); ok {
			t.Fatal("another client got in after foreign unlocks")
		}
		must(t, m.Unlock(octx))
		assertNoLockKeys(t, b, name)
	})
}

// A Lease after its hold was released: Done closed, Err nil, Token kept;
// the primitive's Lease then reports ErrNotHeld. For every kind of hold.
func TestAdvLeaseAfterRelease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for what, kind := range map[string]holdKind{
			"Mutex": mutexHold, "RWMutex write": writeHold, "RWMutex read": readHold, "Semaphore": semHold(3, 2),
		} {
			for _, owned := range []bool{false, true} {
				ctx := ctxT(t)
				if owned {
					ctx = dsync.WithOwner(ctx)
				}
				h := kind(newClient(t, b), redistest.Key(t))
				must(t, h.lock(ctx))
				l, err := h.lease(ctx)
				must(t, err)
				tok := l.Token()
				select {
				case <-l.Done():
					t.Fatalf("%s owned=%v: Done closed while held", what, owned)
				default:
				}
				must(t, h.unlock(ctx))
				select {
				case <-l.Done():
				case <-time.After(5 * time.Second):
					t.Fatalf("%s owned=%v: Done not closed after the release", what, owned)
				}
				if l.Err() != nil || l.Token() != tok {
					t.Errorf("%s owned=%v: after release Err = %v, Token %d; want nil, %d", what, owned, l.Err(), l.Token(), tok)
				}
				if _, err := h.lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
					t.Errorf("%s owned=%v: Lease after release = %v, want ErrNotHeld", what, owned, err)
				}
				checkIs(t, h.unlock(ctx), dsync.ErrNotHeld, what+": a second release = %v, want ErrNotHeld")
			}
		}
	})
}

// Fencing: a Mutex and a Semaphore of one name share one sequence of
// tokens, which rises strictly across both and across the fence hash's
// expiry; the fence hash's expiry is the documented idle one (12 to 24 h).
func TestAdvFencingAcrossMutexAndSemaphore(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		rdb := b.NewClient(t)
		var last uint64
		step := func(what string, lock func() error, lease func() (*dsync.Lease, error), unlock func() error) {
			t.Helper()
			must(t, lock())
			l, err := lease()
			must(t, err)
			if l.Token() <= last {
				t.Fatalf("%s: token %d, want > %d", what, l.Token(), last)
			}
			last = l.Token()
			must(t, unlock())
		}
		m, s := c.Mutex(name), c.Semaphore(name, 2)
		for i := 0; i < 3; i++ {
			step("Mutex", func() error { return m.Lock(ctx) }, func() (*dsync.Lease, error) { return m.Lease(ctx) }, func() error { return m.Unlock(ctx) })
			step("Semaphore", func() error { return s.Acquire(ctx, 2) }, func() (*dsync.Lease, error) { return s.Lease(ctx) }, func() error { return s.Release(ctx, 2) })
			if i == 1 {
				must(t, rdb.Del(ctx, mutexKeys(name).Fence).Err())
			}
		}
		ttl, err := rdb.PTTL(ctx, mutexKeys(name).Fence).Result()
		must(t, err)
		if ttl < 11*time.Hour || ttl > 24*time.Hour {
			t.Errorf("fence hash PTTL %v, want 12 to 24 hours", ttl)
		}
		// RWMutex write tokens rise too, on their own sequence.
		rw := c.RWMutex(name)
		var wlast uint64
		for i := 0; i < 3; i++ {
			l := lockLease(t, ctx, rw)
			if l.Token() <= wlast {
				t.Fatalf("RWMutex write token %d, want > %d", l.Token(), wlast)
			}
			wlast = l.Token()
			must(t, rw.Unlock(ctx))
			if i == 1 {
				must(t, rdb.Del(ctx, rwk(name).Fence).Err())
			}
		}
		ttl, err = rdb.PTTL(ctx, rwk(name).Fence).Result()
		must(t, err)
		if ttl < 11*time.Hour || ttl > 24*time.Hour {
			t.Errorf("RWMutex fence hash PTTL %v, want 12 to 24 hours", ttl)
		}
	})
}

// Redisson's RReadWriteLock re-entry cases with an owner: write, read
// (downgrade), write again (re-entry: the owner writes), two Unlocks leave
// the read hold, which admits other readers and keeps writers out; the
// owner's Lock is then an upgrade, refused at once; RUnlock frees all.
func TestAdvRWMutexWriteReadWriteReentry(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		eachMode(t, func(t *testing.T, local bool, opts ...dsync.Option) {
			ctx := ctxT(t)
			name := redistest.Key(t)
			rw := newClient(t, b, opts...).RWMutex(name)
			other := newClient(t, b).RWMutex(name)
			octx := dsync.WithOwner(ctx)
			wl := lockLease(t, octx, rw)
			must(t, rw.RLock(octx))
			must(t, rw.Lock(octx)) // re-enters the write hold
			if l, err := rw.Lease(octx); err != nil || l.Token() != wl.Token() {
				t.Fatalf("write Lease after re-entry = %v, %v; want token %d", l, err, wl.Token())
			}
			if ok, _ := other.TryRLock(ctx); ok {
				t.Fatal("another reader got in while the owner writes")
			}
			must(t, rw.Unlock(octx))
			if ok, _ := other.TryRLock(ctx); ok {
				t.Fatal("another reader got in while the owner still writes (one level left)")
			}
			must(t, rw.Unlock(octx))
			checkIs(t, rw.Unlock(octx), dsync.ErrNotHeld, "third Unlock = %v, want ErrNotHeld")
			if n, _ := b.NewClient(t).Exists(ctx, rwk(name).Writer).Result(); n != 0 {
				t.Error("writer hash left after the last Unlock")
			}
			if ok, err := other.TryRLock(ctx); !ok || err != nil {
				t.Fatalf("another reader beside the downgraded owner = %v, %v; want true", ok, err)
			}
			must(t, other.RUnlock(ctx))
			if ok, _ := other.TryLock(ctx); ok {
				t.Fatal("a writer got in beside the owner's read hold")
			}
			mustIs(t, rw.Lock(octx), dsync.ErrUpgrade, "Lock while reading = %v, want ErrUpgrade")
			if ok, err := rw.TryLock(octx); ok || !errors.Is(err, dsync.ErrUpgrade) {
				t.Errorf("TryLock while reading = %v, %v; want false, ErrUpgrade", ok, err)
			}
			must(t, rw.RUnlock(octx))
			checkIs(t, rw.RUnlock(octx), dsync.ErrNotHeld, "second RUnlock = %v, want ErrNotHeld")
			if !writeFree(t, ctx, other) {
				t.Fatal("not free after the owner's last RUnlock")
			}
			assertRWReleased(t, b, name)
		})
	})
}

// sync.RWMutex misuse mapped to errors: Unlock of a read hold and RUnlock
// of a write hold return ErrNotHeld and change nothing.
func TestAdvRWMutexWrongUnlockKeepsHold(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, owned := range []bool{false, true} {
			ctx := ctxT(t)
			if owned {
				ctx = dsync.WithOwner(ctx)
			}
			name := redistest.Key(t)
			rw := newClient(t, b).RWMutex(name)
			other := newClient(t, b).RWMutex(name)
			must(t, rw.RLock(ctx))
			checkIs(t, rw.Unlock(ctx), dsync.ErrNotHeld, "Unlock of a read hold = %v, want ErrNotHeld")
			if writeFree(t, ctxT(t), other) {
				t.Fatalf("owned=%v: a writer got in: the read hold was dropped by Unlock", owned)
			}
			must(t, rw.RUnlock(ctx))
			must(t, rw.Lock(ctx))
			checkIs(t, rw.RUnlock(ctx), dsync.ErrNotHeld, "RUnlock of a write hold = %v, want ErrNotHeld")
			if ok, _ := other.TryRLock(ctxT(t)); ok {
				t.Fatalf("owned=%v: a reader got in: the write hold was dropped by RUnlock", owned)
			}
			must(t, rw.Unlock(ctx))
			assertRWReleased(t, b, name)
		}
	})
}

// Writer preference as in sync.RWMutex, told by Redis: once a writer
// waits, a new reader waits too, but an owner re-entering its read hold
// does not (it would deadlock); when the readers leave, the writer gets
// in before the waiting reader.
func TestAdvRWMutexWriterPreferenceReentrantReader(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		reader := newClient(t, b).RWMutex(name)
		rctx := dsync.WithOwner(ctx)
		must(t, reader.RLock(rctx))
		writer := newClient(t, b).RWMutex(name)
		var order []string
		var mu sync.Mutex
		wrote := make(chan error, 1)
		go func() {
			err := writer.Lock(ctx)
			mu.Lock()
			order = append(order, "writer")
			mu.Unlock()
			wrote <- err
		}()
		waitZCard(t, rdb, rwk(name).WaitingWriters, 1, "a waiting writer in Redis")
		late := newClient(t, b).RWMutex(name)
		if ok, err := late.TryRLock(ctx); ok || err != nil {
			t.Fatalf("TryRLock with a writer waiting = %v, %v; want false, nil", ok, err)
		}
		reentryCtx, cancel := context.WithTimeout(rctx, 5*time.Second)
		if err := reader.RLock(reentryCtx); err != nil {
			t.Fatalf("the reader's re-entry with a writer waiting = %v, want nil at once", err)
		}
		cancel()
		read := make(chan error, 1)
		go func() {
			err := late.RLock(ctx)
			mu.Lock()
			order = append(order, "reader")
			mu.Unlock()
			read <- err
		}()
		must(t, reader.RUnlock(rctx))
		select {
		case err := <-wrote:
			t.Fatalf("writer got in (%v) while the reader holds one level", err)
		case <-time.After(200 * time.Millisecond):
		}
		must(t, reader.RUnlock(rctx))
		recvNil(t, wrote, 10*time.Second, "writer not in after the readers left")
		select {
		case err := <-read:
			t.Fatalf("the late reader got in (%v) while the writer holds", err)
		case <-time.After(200 * time.Millisecond):
		}
		must(t, writer.Unlock(ctx))
		recvNil(t, read, 10*time.Second, "late reader not in after the writer left")
		mu.Lock()
		if strings.Join(order, ",") != "writer,reader" {
			t.Errorf("order %v, want writer then reader", order)
		}
		mu.Unlock()
		must(t, late.RUnlock(ctx))
		assertRWReleased(t, b, name)
	})
}

// Once: DoValue hands every caller the winner's value, also when the first
// runner failed and a waiter ran f; the value is binary-safe (spaces,
// newlines, NUL, invalid UTF-8), and f does not run after it succeeded.
func TestAdvOnceValueAfterFailedRunner(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		value := []byte("a b\nc\x00d\xff\xfe \r\n{}@ 1 2 3")
		var runs atomic.Int32
		started, fail := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			_, err := newClient(t, b).Once(name).DoValue(ctx, func(context.Context) ([]byte, error) {
				runs.Add(1)
				close(started)
				<-fail
				return nil, errors.New("first run fails")
			})
			first <- err
		}()
		<-started
		const waiters = 4
		vals := make(chan []byte, waiters)
		for i := 0; i < waiters; i++ {
			go func() {
				v, err := newClient(t, b).Once(name).DoValue(ctx, func(context.Context) ([]byte, error) {
					runs.Add(1)
					return value, nil
				})
				if err != nil {
					t.Error(err)
				}
				vals <- v
			}()
		}
		time.Sleep(50 * time.Millisecond)
		close(fail)
		if err := <-first; err == nil {
			t.Fatal("the failing runner's DoValue = nil, want its error")
		}
		for i := 0; i < waiters; i++ {
			select {
			case v := <-vals:
				if !bytes.Equal(v, value) {
					t.Errorf("waiter got %q, want %q", v, value)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("waiter not done")
			}
		}
		if n := runs.Load(); n != 2 {
			t.Errorf("f ran %d times, want 2 (the failure, then one success)", n)
		}
		// Later calls get the value in one go and run nothing.
		v, err := newClient(t, b).Once(name).DoValue(ctx, func(context.Context) ([]byte, error) {
			runs.Add(1)
			return []byte("late"), nil
		})
		if err != nil || !bytes.Equal(v, value) || runs.Load() != 2 {
			t.Errorf("later DoValue = %q, %v (runs %d); want %q, nil, 2", v, err, runs.Load(), value)
		}
		if err := newClient(t, b).Once(name).Do(ctx, func(context.Context) error { runs.Add(1); return nil }); err != nil || runs.Load() != 2 {
			t.Errorf("later Do = %v (runs %d); want nil without running f", err, runs.Load())
		}
		// Only the done mark stays for good; everything else expires.
		assertAllExpire(t, b, name, time.Minute+10*time.Second, onceKeys(name).Done)
		if n, _ := b.NewClient(t).Exists(ctx, onceKeys(name).Run).Result(); n != 0 {
			t.Error("run hash left after the run succeeded")
		}
	})
}

// Once: f that panics does not leave the name blocked; the next call runs
// f at once (not after the TTL) and the panic reaches the caller.
func TestAdvOncePanicThenNextRunsAtOnce(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		o := newClient(t, b).Once(name)
		func() {
			defer func() {
				if r := recover(); r != "boom" {
					t.Errorf("recovered %v, want the panic value", r)
				}
			}()
			_ = o.Do(ctx, func(context.Context) error { panic("boom") })
			t.Error("Do returned after f panicked")
		}()
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		ran := false
		if err := newClient(t, b).Once(name).Do(qctx, func(context.Context) error { ran = true; return nil }); err != nil || !ran {
			t.Fatalf("Do after a panic = %v, ran %v; want nil, true (TTL is 30 s)", err, ran)
		}
		if done, err := o.Done(ctx); !done || err != nil {
			t.Errorf("Done = %v, %v; want true", done, err)
		}
	})
}

// A Once with a Period: the done mark expires within it, nothing lives for
// good.
func TestAdvOncePeriodLeavesNothingForever(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		must(t, newClient(t, b).Once(name, dsync.Period(time.Hour)).Do(ctx, func(context.Context) error { return nil }))
		ks := assertAllExpire(t, b, name, time.Hour)
		if len(ks) == 0 {
			t.Error("no key at all: where is the done mark?")
		}
	})
}

// After a mixed workload on one name (every primitive, waiters, hand-overs,
// cancelled waiters), every key of the name expires: the fence hashes
// within 24 h, everything else within the replay window; and at most the
// documented keys are left: the two fence hashes and the call ids of each
// primitive.
func TestAdvNothingLeftBehind(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c1, c2 := newClient(t, b), newClient(t, b)
		var wg sync.WaitGroup
		run := func(f func(c *dsync.Client, i int)) {
			for i := 0; i < 6; i++ {
				c := c1
				if i%2 == 1 {
					c = c2
				}
				wg.Add(1)
				go func() { defer wg.Done(); f(c, i) }()
			}
		}
		wctx := func(i int) (context.Context, context.CancelFunc) {
			if i%3 == 2 {
				return context.WithTimeout(ctx, time.Duration(5+i)*time.Millisecond)
			}
			return context.WithCancel(dsync.WithOwner(ctx))
		}
		run(func(c *dsync.Client, i int) {
			m := c.Mutex(name)
			for k := 0; k < 5; k++ {
				lctx, cancel := wctx(i)
				if m.Lock(lctx) == nil {
					_ = m.Unlock(lctx)
				}
				cancel()
			}
		})
		run(func(c *dsync.Client, i int) {
			rw := c.RWMutex(name)
			for k := 0; k < 5; k++ {
				lctx, cancel := wctx(i)
				if (i+k)%2 == 0 {
					if rw.Lock(lctx) == nil {
						if rw.RLock(lctx) == nil {
							_ = rw.Unlock(lctx)
							_ = rw.RUnlock(lctx)
						} else {
							_ = rw.Unlock(lctx)
						}
					}
				} else if rw.RLock(lctx) == nil {
					_ = rw.RUnlock(lctx)
				}
				cancel()
			}
		})
		run(func(c *dsync.Client, i int) {
			s := c.Semaphore(name, 3)
			for k := 0; k < 5; k++ {
				lctx, cancel := wctx(i)
				n := int64(1 + (i+k)%3)
				if s.Acquire(lctx, n) == nil {
					_ = s.Release(lctx, n)
				}
				cancel()
			}
		})
		run(func(c *dsync.Client, i int) {
			lctx, cancel := wctx(i)
			_ = c.Once(name, dsync.Period(time.Minute)).Do(lctx, func(context.Context) error {
				time.Sleep(time.Millisecond)
				if i < 3 {
					return errors.New("fails")
				}
				return nil
			})
			cancel()
		})
		wg.Wait()
		dsync.WaitCleanups(c1)
		dsync.WaitCleanups(c2)
		fences := []string{mutexKeys(name).Fence, rwk(name).Fence}
		ks := assertAllExpire(t, b, name, 24*time.Hour)
		allowed := map[string]bool{
			mutexKeys(name).Fence: true, rwk(name).Fence: true,
			mutexKeys(name).Calls: true, rwk(name).Calls: true, semKeys(name).Calls: true, onceKeys(name).Calls: true,
			onceKeys(name).Done: true,
		}
		rdb := b.NewClient(t)
		for _, k := range ks {
			if !allowed[k] {
				dump, _ := rdb.Dump(ctx, k).Result()
				t.Errorf("key %s left (%q), want only fence hashes, call ids and the done mark", k, dump)
			}
		}
		assertAllExpire(t, b, name, time.Minute+10*time.Second, append(fences, onceKeys(name).Done)...)
		if b.Mini != nil {
			// Past the replay window only the fence hashes are left.
			b.Advance(2 * time.Minute)
			for _, k := range nameKeys(t, b, name) {
				if k != fences[0] && k != fences[1] {
					t.Errorf("key %s left past the replay window and the period", k)
				}
			}
		}
	})
}

// Names that stress the key layout, the channels and the hand-over
// messages: unicode, very long, with spaces, '@', ':', glob characters,
// newlines. Each primitive works, and a waiter is woken by the release
// (well before its 30 s TTL).
func TestAdvOddNamesWork(t *testing.T) {
	names := []string{
		"ünïcødé-名前-🔒", strings.Repeat("L", 4096), "a b c", "x@y", "@", "a:b:{c}:d", "*", "?[a-z]*", "line1\nline2",
		"\x00nul", " ", ":x", "=", "{}}", "}{",
	}
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		prefix := dsync.Prefix(redistest.Key(t))
		for i, name := range names {
			t.Run(strings.ReplaceAll(string(rune('a'+i)), "/", "_"), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				c1, c2 := newClient(t, b, prefix), newClient(t, b, prefix)
				braceMutex(ctx, t, c1.Mutex(name), c2.Mutex(name))
				braceRWMutex(ctx, t, c1.RWMutex(name), c2.RWMutex(name))
				braceSemaphore(ctx, t, c1.Semaphore(name, 2), c2.Semaphore(name, 2))
				braceOnce(ctx, t, c1.Once(name), c2.Once(name))
			})
		}
	})
}

// Names that differ only in what an encoding or a hash tag could confuse
// are distinct locks.
func TestAdvSimilarNamesAreDistinct(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		prefix := dsync.Prefix(redistest.Key(t))
		c := newClient(t, b, prefix)
		names := []string{"a", "a ", " a", "a\n", "a@", "a}", "{a}", "a:f", "a}:f", "", "=", "=YQ", "}a", "A"}
		var held []*dsync.Mutex
		for _, n := range names {
			if n == "" {
				continue // empty is invalid
			}
			m := c.Mutex(n)
			if ok, err := m.TryLock(ctx); !ok || err != nil {
				t.Fatalf("TryLock(%q) = %v, %v; want true: it shares a lock with an earlier name", n, ok, err)
			}
			held = append(held, m)
		}
		for _, m := range held {
			must(t, m.Unlock(ctx))
		}
	})
}

// Bad input at the edges of the documented ranges.
func TestAdvBadInputEdges(t *testing.T) {
	b := redistest.Miniredis(t)
	counter := &redistest.Counter{}
	c, _ := hookedClient(t, b, counter)
	ctx := context.Background()
	var nilClient *dsync.Client
	invalid := map[string]func() error{
		"TTL below 1 ms": func() error { return c.Mutex("x", dsync.TTL(time.Millisecond-1)).Lock(ctx) },
		"Period below 1 ms": func() error {
			return c.Once("x", dsync.Period(time.Microsecond)).Do(ctx, func(context.Context) error { return nil })
		},
		"owner token of 257 bytes": func() error {
			return c.Mutex("x").Lock(dsync.WithOwnerToken(ctx, strings.Repeat("t", 257)))
		},
		"owner token beginning with ':'": func() error { return c.Mutex("x").Lock(dsync.WithOwnerToken(ctx, ":")) },
		"owner token with a space":       func() error { return c.Semaphore("x", 1).Acquire(dsync.WithOwnerToken(ctx, "a b"), 1) },
		"owner token with a newline":     func() error { return c.RWMutex("x").RLock(dsync.WithOwnerToken(ctx, "a\nb")) },
		"Semaphore Acquire n = size+1":   func() error { return c.Semaphore("x", 1).Acquire(ctx, 2) },
		"Semaphore Release n = 0":        func() error { return c.Semaphore("x", 1).Release(ctx, 0) },
		"RWMutex RLock, empty name":      func() error { return c.RWMutex("").RLock(ctx) },
		"Semaphore size 0, Lease": func() error {
			_, err := c.Semaphore("x", 0).Lease(ctx)
			return err
		},
		"Mutex Lease, empty name": func() error {
			_, err := c.Mutex("").Lease(ctx)
			return err
		},
		"Once Done, empty name": func() error {
			_, err := c.Once("").Done(ctx)
			return err
		},
		"Once Reset, nil client": func() error { return dsync.New(nil).Once("x").Reset(ctx) },
		"Mutex TryLock, nil client": func() error {
			_, err := dsync.New(nil).Mutex("x").TryLock(ctx)
			return err
		},
		"Mutex Unlock, nil client":   func() error { return dsync.New(nil).Mutex("x").Unlock(ctx) },
		"Mutex Lock, nil *Client":    func() error { return nilClient.Mutex("x").Lock(ctx) },
		"RWMutex RLock, nil *Client": func() error { return nilClient.RWMutex("x").RLock(ctx) },
		"RWMutex Lock, nil *Client":  func() error { return nilClient.RWMutex("x").Lock(ctx) },
		"Semaphore Acquire, nil *Client": func() error {
			return nilClient.Semaphore("x", 1).Acquire(ctx, 1)
		},
		"Once Do, nil *Client": func() error {
			return nilClient.Once("x").Do(ctx, func(context.Context) error { return nil })
		},
		"Close of a nil *Client":         func() error { return nilClient.Close() },
		"Close of a nil *Quorum":         func() error { return (*dsync.Quorum)(nil).Close() },
		"Mutex Lock, zero Client":        func() error { return new(dsync.Client).Mutex("x").Lock(ctx) },
		"Semaphore Acquire, zero Client": func() error { return new(dsync.Client).Semaphore("x", 1).Acquire(ctx, 1) },
		"Close of a zero Client":         func() error { return new(dsync.Client).Close() },
		"RWMutex Lock, zero Quorum":      func() error { return new(dsync.Quorum).RWMutex("x").Lock(ctx) },
		"Close of a zero Quorum":         func() error { return new(dsync.Quorum).Close() },
		"Quorum of no clients":           func() error { return dsync.NewQuorum(nil).Mutex("x").Lock(ctx) },
		"Quorum with a nil client": func() error {
			return dsync.NewQuorum([]redis.UniversalClient{b.NewClient(t), nil, b.NewClient(t)}).Mutex("x").Lock(ctx)
		},
	}
	for what, f := range invalid {
		if err := f(); !errors.Is(err, dsync.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", what, err)
		} else if !strings.HasPrefix(err.Error(), "dsync:") {
			t.Errorf("%s: error %q does not begin with dsync:", what, err)
		}
	}
	if n := counter.RoundTrips(); n != 0 {
		t.Errorf("bad input sent %d commands, want 0", n)
	}
	// The edges that are valid.
	octx := dsync.WithOwnerToken(ctx, strings.Repeat("t", 256))
	m := c.Mutex("x", dsync.TTL(time.Millisecond))
	must(t, m.Lock(octx))
	_ = m.Unlock(octx)
	s := c.Semaphore("y", 2)
	must(t, s.Acquire(ctx, 2))
	must(t, s.Release(ctx, 2))
}

// After Close: a waiting call returns ErrClosed promptly, held leases end
// with ErrClosed, and every later call (releases included) returns
// ErrClosed without hanging.
func TestAdvCloseEndsEverything(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		holder := newClient(t, b)
		must(t, holder.Mutex(name).Lock(ctx))
		c := dsync.New(b.NewClient(t))
		m, rw, s, o := c.Mutex(name+"m"), c.RWMutex(name), c.Semaphore(name, 2), c.Once(name)
		l := lockLease(t, ctx, m)
		waits := make(chan error, 2)
		go func() { waits <- c.Mutex(name).Lock(ctx) }()
		go func() {
			waits <- c.Once(name+"o").Do(ctx, func(fctx context.Context) error {
				<-fctx.Done()
				return context.Cause(fctx)
			})
		}()
		time.Sleep(100 * time.Millisecond)
		closed := time.Now()
		must(t, c.Close())
		for i := 0; i < 2; i++ {
			select {
			case err := <-waits:
				checkIs(t, err, dsync.ErrClosed, "call in progress at Close = %v, want ErrClosed")
			case <-time.After(5 * time.Second):
				t.Fatal("a call in progress did not return after Close")
			}
		}
		select {
		case <-l.Done():
			checkIs(t, l.Err(), dsync.ErrClosed, "Lease.Err after Close = %v, want ErrClosed")
		case <-time.After(5 * time.Second):
			t.Fatal("Lease not done after Close")
		}
		calls := map[string]func() error{
			"Mutex.Unlock":       func() error { return m.Unlock(ctx) },
			"Mutex.Lock":         func() error { return m.Lock(ctx) },
			"RWMutex.RLock":      func() error { return rw.RLock(ctx) },
			"RWMutex.RUnlock":    func() error { return rw.RUnlock(ctx) },
			"Semaphore.Acquire":  func() error { return s.Acquire(ctx, 1) },
			"Semaphore.Release":  func() error { return s.Release(ctx, 1) },
			"Once.Done":          func() error { _, err := o.Done(ctx); return err },
			"Once.Reset":         func() error { return o.Reset(ctx) },
			"Mutex.TryLock":      func() error { _, err := m.TryLock(ctx); return err },
			"Semaphore.TryAcqu.": func() error { _, err := s.TryAcquire(ctx, 1); return err },
		}
		for what, f := range calls {
			errc := make(chan error, 1)
			go func() { errc <- f() }()
			select {
			case err := <-errc:
				checkIs(t, err, dsync.ErrClosed, what+" after Close = %v, want ErrClosed")
			case <-time.After(5 * time.Second):
				t.Fatalf("%s after Close hangs", what)
			}
		}
		if d := time.Since(closed); d > 15*time.Second {
			t.Errorf("Close and the calls after it took %v", d)
		}
		must(t, c.Close()) // safe twice
		// The hold of the closed Client was not released: it expires.
		if n, _ := b.NewClient(t).Exists(ctx, mutexKeys(name+"m").Lock).Result(); n != 1 {
			t.Error("Close released a hold; the doc says holds expire at their TTL")
		}
	})
}

// Owner tokens may hold any bytes but a leading ':', a space or a newline
// (up to 256 bytes): '@', tabs, braces, glob characters, unicode. Such an
// owner re-enters, waits in the queue, is handed the hold, and releases, on
// every primitive.
func TestAdvOddOwnerTokens(t *testing.T) {
	toks := []string{"a@b", "@", "ü名", strings.Repeat("z", 256), "1\t2", "x{y}", "\r", "*?[", "=", "a:b"}
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for i, tok := range toks {
			t.Run(string(rune('a'+i)), func(t *testing.T) {
				ctx := ctxT(t)
				name := redistest.Key(t)
				rdb := b.NewClient(t)
				octx := dsync.WithOwnerToken(ctx, tok)
				// Mutex: held by another, the owner queues and is handed it.
				holder := newClient(t, b).Mutex(name)
				must(t, holder.Lock(ctx))
				m := newClient(t, b).Mutex(name)
				got := make(chan error, 1)
				go func() { got <- m.Lock(octx) }()
				waitZCard(t, rdb, mutexKeys(name).Queue, 1, "the owner queued")
				must(t, holder.Unlock(ctx))
				recvNil(t, got, 10*time.Second, "owner not handed the Mutex")
				must(t, m.Lock(octx))
				if c := reentryCount(t, b, name, tok); c != 2 {
					t.Errorf("Mutex count in Redis = %d, want 2", c)
				}
				if ok, _ := holder.TryLock(ctx); ok {
					t.Fatal("another got in while the owner holds")
				}
				must(t, m.Unlock(octx))
				must(t, m.Unlock(octx))
				assertNoLockKeys(t, b, name)
				// Semaphore: the owner queues behind a full semaphore.
				s1 := newClient(t, b).Semaphore(name, 2)
				must(t, s1.Acquire(ctx, 2))
				s2 := newClient(t, b).Semaphore(name, 2)
				go func() { got <- s2.Acquire(octx, 2) }()
				waitQueued(t, b, name, 1)
				must(t, s1.Release(ctx, 2))
				recvNil(t, got, 10*time.Second, "owner not handed the permits")
				if n, _ := rdb.HGet(ctx, semKeys(name).State, tok).Int(); n != 2 {
					t.Errorf("owner's permits in Redis = %d, want 2", n)
				}
				must(t, s2.Release(octx, 1))
				must(t, s1.Release(octx, 1)) // the owner, through another handle
				assertNoSemKeys(t, b, name)
				// RWMutex: the owner writes behind a reader, then reads too.
				r := newClient(t, b).RWMutex(name)
				must(t, r.RLock(ctx))
				w := newClient(t, b).RWMutex(name)
				go func() { got <- w.Lock(octx) }()
				waitZCard(t, rdb, rwk(name).WaitingWriters, 1, "the writer waiting")
				must(t, r.RUnlock(ctx))
				recvNil(t, got, 10*time.Second, "owner not handed the write lock")
				must(t, w.RLock(octx))
				must(t, w.Unlock(octx))
				if ok, _ := r.TryRLock(ctx); !ok {
					t.Error("another reader refused beside the owner's read hold")
				} else {
					must(t, r.RUnlock(ctx))
				}
				must(t, w.RUnlock(octx))
				assertRWReleased(t, b, name)
			})
		}
	})
}

// An owner in ctx plays no part in a Once: two calls of one owner do not
// both run f at once.
func TestAdvOnceIgnoresOwner(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := dsync.WithOwner(ctxT(t))
		name := redistest.Key(t)
		o := newClient(t, b).Once(name)
		var inside, runs atomic.Int32
		f := func(context.Context) error {
			if inside.Add(1) > 1 {
				t.Error("two calls of one owner run f at once")
			}
			runs.Add(1)
			time.Sleep(100 * time.Millisecond)
			inside.Add(-1)
			return errors.New("fails, so the other call runs f too")
		}
		var wg sync.WaitGroup
		for i := 0; i < 2; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = o.Do(ctx, f)
			}()
		}
		wg.Wait()
		if runs.Load() != 2 {
			t.Errorf("f ran %d times, want 2 (each call, one after the other)", runs.Load())
		}
	})
}

// Like sync.Once, Do on the same name from inside f waits for itself until
// its ctx ends; that inner call takes nothing, and the outer run then
// marks the Once done.
func TestAdvOnceDoInsideF(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		o := newClient(t, b).Once(name)
		var inner error
		err := o.Do(ctx, func(fctx context.Context) error {
			ictx, cancel := context.WithTimeout(fctx, 300*time.Millisecond)
			defer cancel()
			inner = o.Do(ictx, func(context.Context) error {
				t.Error("inner f ran while the outer one runs")
				return nil
			})
			return nil
		})
		must(t, err)
		checkIs(t, inner, context.DeadlineExceeded, "inner Do = %v, want DeadlineExceeded")
		if done, err := o.Done(ctx); !done || err != nil {
			t.Errorf("Done = %v, %v; want true", done, err)
		}
	})
}

// DoValue: an empty value is returned as nil, to the runner and to later
// calls; a Once done by Do has an empty value.
func TestAdvOnceEmptyValueIsNil(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		o := newClient(t, b).Once(name)
		v, err := o.DoValue(ctx, func(context.Context) ([]byte, error) { return []byte{}, nil })
		if err != nil || v != nil {
			t.Errorf("runner's DoValue = %q (nil %v), %v; want nil", v, v == nil, err)
		}
		v, err = newClient(t, b).Once(name).DoValue(ctx, func(context.Context) ([]byte, error) { return []byte("x"), nil })
		if err != nil || v != nil {
			t.Errorf("later DoValue = %q (nil %v), %v; want nil", v, v == nil, err)
		}
		name2 := redistest.Key(t)
		must(t, o.Reset(ctx))
		must(t, newClient(t, b).Once(name2).Do(ctx, func(context.Context) error { return nil }))
		v, err = newClient(t, b).Once(name2).DoValue(ctx, func(context.Context) ([]byte, error) { return []byte("x"), nil })
		if err != nil || v != nil {
			t.Errorf("DoValue of a Once done by Do = %q, %v; want nil", v, err)
		}
	})
}

// A writer that downgraded (holds the write lock and a read hold) while
// another writer waits: its Unlock must not hand the lock to the waiting
// writer (it still reads); its RUnlock then does. Its read hold carries
// token 0.
func TestAdvRWMutexDowngradeWithWriterWaiting(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		eachMode(t, func(t *testing.T, local bool, opts ...dsync.Option) {
			ctx := ctxT(t)
			name := redistest.Key(t)
			rdb := b.NewClient(t)
			rw := newClient(t, b, opts...).RWMutex(name)
			octx := dsync.WithOwner(ctx)
			must(t, rw.Lock(octx))
			w2 := newClient(t, b).RWMutex(name)
			wrote := make(chan error, 1)
			go func() { wrote <- w2.Lock(ctx) }()
			waitZCard(t, rdb, rwk(name).WaitingWriters, 1, "the second writer waiting")
			// Let it wait past the starvation threshold, so that it queues.
			time.Sleep(50 * time.Millisecond)
			if ok, err := rw.TryRLock(octx); !ok || err != nil {
				t.Fatalf("the writer's TryRLock with a writer waiting = %v, %v; want true", ok, err)
			}
			if l, err := rw.RLease(octx); err != nil || l.Token() != 0 {
				t.Errorf("RLease = %v, %v; want token 0", l, err)
			}
			must(t, rw.Unlock(octx))
			select {
			case err := <-wrote:
				t.Fatalf("the waiting writer got in (%v) while the downgraded owner reads", err)
			case <-time.After(300 * time.Millisecond):
			}
			if n, _ := rdb.ZCard(ctx, rwk(name).Readers).Result(); n != 1 {
				t.Errorf("readers in Redis = %d, want 1 (the downgraded owner)", n)
			}
			must(t, rw.RUnlock(octx))
			recvNil(t, wrote, 10*time.Second, "waiting writer not in after the last RUnlock")
			must(t, w2.Unlock(ctx))
			assertRWReleased(t, b, name)
		})
	})
}

// No polling: a waiter for a hold that lasts a while sends a handful of
// commands, not one every few ms; every primitive.
func TestAdvWaiterDoesNotPoll(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for what, kind := range map[string]holdKind{
			"Mutex": mutexHold, "RWMutex write": writeHold, "RWMutex read": readHold, "Semaphore": semHold(1, 1),
		} {
			ctx := ctxT(t)
			name := redistest.Key(t)
			holder := kind(newClient(t, b), name)
			if what == "RWMutex read" {
				holder = writeHold(newClient(t, b), name)
			}
			must(t, holder.lock(ctx))
			counter := &redistest.Counter{}
			c, _ := hookedClient(t, b, counter)
			w := kind(c, name)
			got := make(chan error, 1)
			go func() { got <- w.lock(ctx) }()
			time.Sleep(1500 * time.Millisecond)
			n := counter.RoundTrips()
			must(t, holder.unlock(ctx))
			recvNil(t, got, 10*time.Second, what+": waiter not woken by the release")
			if n > 6 {
				t.Errorf("%s: waiter sent %d commands in 1.5 s of waiting, want a handful", what, n)
			}
			must(t, w.unlock(ctx))
		}
	})
}

// Redisson's read locks with different lease times: a reader (or
// semaphore holder) with a short lease that dies does not shorten the
// share of one with a long lease; the long one still holds when the short
// one's lease has run out, and releases without ErrLeaseLost.
func TestAdvShortLeaseDoesNotShortenOthers(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const short = 400 * time.Millisecond
		long := newClient(t, b, dsync.TTL(10*time.Second))
		dying := dsync.New(b.NewClient(t), dsync.TTL(short))
		t.Cleanup(func() { dying.Close() })
		rwLong, rwShort := long.RWMutex(name), dying.RWMutex(name)
		sLong, sShort := long.Semaphore(name, 3), dying.Semaphore(name, 3)
		must(t, rwLong.RLock(ctx))
		must(t, sLong.Acquire(ctx, 1))
		must(t, rwShort.RLock(ctx))
		must(t, sShort.Acquire(ctx, 2))
		dying.Close()
		b.Advance(short + 600*time.Millisecond)
		other := newClient(t, b)
		if writeFree(t, ctx, other.RWMutex(name)) {
			t.Fatal("a writer got in while the long reader holds")
		}
		if ok, _ := other.Semaphore(name, 3).TryAcquire(ctx, 3); ok {
			t.Fatal("3 permits free while the long holder holds 1")
		}
		so := other.Semaphore(name, 3)
		ok, err := so.TryAcquire(ctx, 2)
		if !ok || err != nil {
			t.Fatalf("TryAcquire(2) after the short holder died = %v, %v; want its permits back", ok, err)
		}
		must(t, so.Release(ctx, 2))
		must(t, rwLong.RUnlock(ctx))
		must(t, sLong.Release(ctx, 1))
		assertRWReleased(t, b, name)
		assertNoSemKeys(t, b, name)
	})
}

// Every key dsync writes expires, also while names are busy: with holders,
// queued waiters and a run of a Once in progress, every key of the name
// has an expiry (the Once's done mark is not there yet).
func TestAdvKeysExpireWhileContended(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		c := newClient(t, b)
		m := c.Mutex(name)
		must(t, m.Lock(ctx))
		rw := c.RWMutex(name)
		must(t, rw.RLock(ctx))
		s := c.Semaphore(name, 2)
		must(t, s.Acquire(ctx, 2))
		started, end := make(chan struct{}), make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.Once(name).Do(ctx, func(context.Context) error { close(started); <-end; return errors.New("fails") })
		}()
		<-started
		wctx, cancel := context.WithCancel(ctx)
		dying := dsync.New(b.NewClient(t)) // closed while its call waits
		t.Cleanup(func() { dying.Close() })
		waiters := []holdCalls{
			mutexHold(newClient(t, b), name),
			mutexHold(dying, name),
			writeHold(newClient(t, b), name),
			readHold(newClient(t, b), name),
			semHold(2, 1)(newClient(t, b), name),
		}
		for _, w := range waiters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				octx := dsync.WithOwner(wctx)
				if w.lock(octx) == nil {
					// It got in as the others left: release it.
					_ = w.unlock(octx)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = newClient(t, b).Once(name).Do(wctx, func(context.Context) error { return errors.New("fails") })
		}()
		waitFor(t, 10*time.Second, "the waiters queued", func() bool {
			a, _ := rdb.ZCard(ctx, mutexKeys(name).Queue).Result()
			w, _ := rdb.ZCard(ctx, rwk(name).WaitingWriters).Result()
			q, _ := rdb.ZCard(ctx, semKeys(name).Queue).Result()
			return a == 2 && w == 1 && q == 1
		})
		time.Sleep(100 * time.Millisecond) // the writer queues past its threshold
		assertAllExpire(t, b, name, 24*time.Hour)
		dying.Close()
		assertAllExpire(t, b, name, 24*time.Hour)
		cancel()
		close(end)
		wg.Wait()
		must(t, m.Unlock(ctx))
		must(t, rw.RUnlock(ctx))
		must(t, s.Release(ctx, 2))
		dsync.WaitCleanups(c)
		assertAllExpire(t, b, name, 24*time.Hour)
		// The Mutex may have been handed to the waiter of the closed
		// Client, dead in the queue: that hold lasts its TTL at most.
		if ttl, _ := rdb.PTTL(ctx, mutexKeys(name).Lock).Result(); ttl > dsync.DefaultTTL {
			t.Errorf("lock hash PTTL %v, want at most the dead waiter's TTL", ttl)
		}
		assertRWReleased(t, b, name)
		assertNoSemKeys(t, b, name)
	})
}

// The owner of a hold re-enters with TryLock (and Lock) also while others
// are queued for it: they wait for its last Unlock, which hands the lock
// to the first in line with a larger fencing token.
func TestAdvOwnerReentersPastTheQueue(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		eachMode(t, func(t *testing.T, local bool, opts ...dsync.Option) {
			ctx := ctxT(t)
			name := redistest.Key(t)
			rdb := b.NewClient(t)
			octx := dsync.WithOwner(ctx)
			m := newClient(t, b, opts...).Mutex(name)
			l := lockLease(t, octx, m)
			w := newClient(t, b).Mutex(name)
			got := make(chan error, 1)
			go func() { got <- w.Lock(ctx) }()
			waitZCard(t, rdb, mutexKeys(name).Queue, 1, "the waiter queued")
			if ok, err := m.TryLock(octx); !ok || err != nil {
				t.Fatalf("the owner's TryLock with a waiter queued = %v, %v; want true (re-entry)", ok, err)
			}
			rctx, cancel := context.WithTimeout(octx, 5*time.Second)
			must(t, m.Lock(rctx))
			cancel()
			if c, want := holderField(t, rdb, mutexKeys(name).Lock, dsync.OwnerToken(octx)), map[bool]string{false: "3", true: "1"}[local]; c != want {
				t.Errorf("count in Redis = %q, want %s", c, want)
			}
			for i := 0; i < 2; i++ {
				must(t, m.Unlock(octx))
				select {
				case err := <-got:
					t.Fatalf("the waiter got in (%v) while the owner holds", err)
				case <-time.After(100 * time.Millisecond):
				}
			}
			must(t, m.Unlock(octx))
			recvNil(t, got, 10*time.Second, "waiter not handed the lock")
			if wl, err := w.Lease(ctx); err != nil || wl.Token() <= l.Token() {
				t.Errorf("waiter's Lease = %v, %v; want a token > %d", wl, err, l.Token())
			}
			must(t, w.Unlock(ctx))
			assertNoLockKeys(t, b, name)
		})
	})
}

// One handle without an owner shared by goroutines that all wait: the
// release lets exactly one in (a hand-over grants one call), and the
// others wait for that one's release, as with a shared sync.Mutex; a
// shared Semaphore handle's waiters are each granted their own permits.
func TestAdvSharedHandleWaitersOneAtATime(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		holder := newClient(t, b).Mutex(name)
		must(t, holder.Lock(ctx))
		m := newClient(t, b).Mutex(name)
		got := make(chan error, 3)
		for i := 0; i < 3; i++ {
			go func() { got <- m.Lock(ctx) }()
		}
		waitZCard(t, rdb, mutexKeys(name).Queue, 1, "a waiter queued")
		time.Sleep(50 * time.Millisecond)
		must(t, holder.Unlock(ctx))
		for i := 0; i < 3; i++ {
			recvNil(t, got, 10*time.Second, "a waiter of the shared handle not let in")
			select {
			case err := <-got:
				t.Fatalf("two goroutines of one handle hold it at once (%v)", err)
			case <-time.After(150 * time.Millisecond):
			}
			if ok, _ := holder.TryLock(ctx); ok {
				t.Fatal("another handle got in while the shared handle holds")
			}
			must(t, m.Unlock(ctx))
		}
		assertNoLockKeys(t, b, name)

		sname := redistest.Key(t)
		sh := newClient(t, b).Semaphore(sname, 2)
		must(t, sh.Acquire(ctx, 2))
		s := newClient(t, b).Semaphore(sname, 2)
		for i := 0; i < 2; i++ {
			go func() { got <- s.Acquire(ctx, 1) }()
		}
		waitQueued(t, b, sname, 2)
		for i := 0; i < 2; i++ {
			must(t, sh.Release(ctx, 1))
			recvNil(t, got, 10*time.Second, "a waiter of the shared semaphore handle not served")
			select {
			case err := <-got:
				t.Fatalf("both waiters served by one released permit (%v)", err)
			case <-time.After(150 * time.Millisecond):
			}
		}
		if n, _ := rdb.HGet(ctx, semKeys(sname).State, ":used").Int(); n != 2 {
			t.Errorf(":used = %d, want 2", n)
		}
		must(t, s.Release(ctx, 2))
		assertNoSemKeys(t, b, sname)
	})
}

// redsync's TestMutexQuorum: with k of 5 masters held by someone else
// (a Client on that master alone), a Quorum's TryLock succeeds exactly
// when a majority is free, never touches the others' holds, and an Unlock
// through another Quorum with the same owner token (redsync's split
// lock/unlock) releases it on every master that granted it.
func TestAdvQuorumCloggedMasters(t *testing.T) {
	const n = 5
	rdbs := miniMasters(t, n)
	ctx := ctxT(t)
	for k := 0; k <= n; k++ {
		name := redistest.Key(t)
		var cloggers []*dsync.Mutex
		for i := 0; i < k; i++ {
			c := dsync.New(rdbs[i])
			t.Cleanup(func() { c.Close() })
			m := c.Mutex(name)
			must(t, m.Lock(ctx))
			cloggers = append(cloggers, m)
		}
		q := newQuorum(t, rdbs)
		octx := dsync.WithOwner(ctx)
		ok, err := q.Mutex(name).TryLock(octx)
		want := n-k >= n/2+1
		if ok != want || (err != nil && !errors.Is(err, dsync.ErrNoQuorum)) {
			t.Errorf("k=%d clogged: TryLock = %v, %v; want %v", k, ok, err, want)
		}
		for i := 0; i < n; i++ {
			owned := holderField(t, rdbs[i], mutexKeys(name).Lock, dsync.OwnerToken(octx)) != ""
			if owned && (!ok || i < k) {
				t.Errorf("k=%d: master %d records the quorum's owner (TryLock %v, clogged %v)", k, i, ok, i < k)
			}
			if ok && i >= k && !owned {
				t.Errorf("k=%d: free master %d does not record the granted hold", k, i)
			}
		}
		if ok {
			other := newQuorum(t, rdbs)
			must(t, other.Mutex(name).Unlock(dsync.WithOwnerToken(ctx, dsync.OwnerToken(octx))))
			for i := k; i < n; i++ {
				if ex, _ := rdbs[i].Exists(ctx, mutexKeys(name).Lock).Result(); ex != 0 {
					t.Errorf("k=%d: master %d still holds after the split Unlock", k, i)
				}
			}
		}
		for i, m := range cloggers {
			if err := m.Unlock(ctx); err != nil {
				t.Errorf("k=%d: clogger %d's Unlock = %v, want nil (its hold untouched)", k, i, err)
			}
		}
	}
}

// Counts beyond 2^53 cannot be counted exactly by the scripts (Lua
// numbers are doubles): a size of 2^60 let 2^60 + 1 permits be held (a
// TryAcquire(1) with all permits held succeeded). Such a size is bad
// input; the largest size allowed counts exactly.
func TestAdvSemaphoreHugeSize(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		for _, size := range []int64{1 << 60, dsync.MaxSemaphoreSize + 1, 1<<63 - 1} {
			err := newClient(t, b).Semaphore(name, size).Acquire(ctx, 1)
			checkIs(t, err, dsync.ErrInvalid, "Acquire on a semaphore of a size past 2^52 = %v, want ErrInvalid")
		}
		const size = dsync.MaxSemaphoreSize
		s := newClient(t, b).Semaphore(name, size)
		other := newClient(t, b).Semaphore(name, size)
		third := newClient(t, b).Semaphore(name, size)
		must(t, s.Acquire(ctx, 1))
		if ok, err := other.TryAcquire(ctx, size-1); !ok || err != nil {
			t.Fatalf("TryAcquire(size-1) with 1 held = %v, %v; want true", ok, err)
		}
		if ok, err := third.TryAcquire(ctx, 1); ok || err != nil {
			t.Errorf("TryAcquire(1) with all %d permits held = %v, %v; want false", size, ok, err)
		}
		if ok, err := third.TryAcquire(ctx, size); ok || err != nil {
			t.Errorf("TryAcquire(size) with all permits held = %v, %v; want false", ok, err)
		}
		if n, _ := b.NewClient(t).HGet(ctx, semKeys(name).State, ":used").Int64(); n != size {
			t.Errorf(":used = %d, want %d", n, size)
		}
		must(t, other.Release(ctx, size-2))
		if ok, err := third.TryAcquire(ctx, size-1); ok || err != nil {
			t.Errorf("TryAcquire(size-1) with 2 held = %v, %v; want false", ok, err)
		}
		if ok, err := third.TryAcquire(ctx, size-2); !ok || err != nil {
			t.Errorf("TryAcquire(size-2) with 2 held = %v, %v; want true", ok, err)
		}
		must(t, other.Release(ctx, 1))
		must(t, s.Release(ctx, 1))
		must(t, third.Release(ctx, size-2))
		assertNoSemKeys(t, b, name)
	})
}

// f succeeds although the caller's ctx ended while it ran: f returned nil,
// so the Once is done (marked in the background if need be), and a later
// call does not run f again.
func TestAdvOnceSucceedsAfterCallerCtxEnded(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		name := redistest.Key(t)
		c := newClient(t, b)
		ctx, cancel := context.WithCancel(context.Background())
		err := c.Once(name).Do(ctx, func(context.Context) error {
			cancel()
			return nil
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("Do = %v, want nil or context.Canceled", err)
		}
		dsync.WaitCleanups(c)
		qctx := ctxT(t)
		if done, err := newClient(t, b).Once(name).Done(qctx); !done || err != nil {
			t.Errorf("Done = %v, %v; want true: f returned nil", done, err)
		}
		ran := false
		must(t, newClient(t, b).Once(name).Do(qctx, func(context.Context) error { ran = true; return nil }))
		if ran {
			t.Error("f ran again after a run that returned nil")
		}
	})
}

// Waiting costs one shared pub/sub connection per Client, not one per
// waiter: many waiters on many names and every primitive, as the server
// sees it (CLIENT LIST).
func TestAdvOnePubSubConnectionPerClient(t *testing.T) {
	b := realOnly(t)
	ctx := ctxT(t)
	clientName := "adv-ps-" + strings.ReplaceAll(redistest.Key(t)[len(t.Name())+1:], ":", "")
	rdb := redis.NewClient(&redis.Options{Addr: b.Addrs[0], ClientName: clientName})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dsync.New(rdb)
	t.Cleanup(func() { c.Close() })
	holder := newClient(t, b)
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	const names = 8
	for i := 0; i < names; i++ {
		name := redistest.Key(t)
		must(t, holder.Mutex(name).Lock(ctx))
		must(t, holder.RWMutex(name).Lock(ctx))
		must(t, holder.Semaphore(name, 1).Acquire(ctx, 1))
		for _, w := range []func() error{
			func() error { return c.Mutex(name).Lock(wctx) },
			func() error { return c.RWMutex(name).RLock(wctx) },
			func() error { return c.Semaphore(name, 1).Acquire(wctx, 1) },
		} {
			wg.Add(1)
			go func() { defer wg.Done(); _ = w() }()
		}
	}
	subscribers := func() int {
		list, err := b.NewClient(t).ClientList(ctx).Result()
		must(t, err)
		n := 0
		for _, line := range strings.Split(list, "\n") {
			if !strings.Contains(line, " name="+clientName+" ") {
				continue
			}
			if !strings.Contains(line, " sub=0 ") || !strings.Contains(line, " psub=0 ") ||
				(strings.Contains(line, " ssub=") && !strings.Contains(line, " ssub=0 ")) {
				n++
			}
		}
		return n
	}
	// The first waiter's subscription is up; the others have had time to
	// subscribe too (one more connection would show in the count).
	waitFor(t, 10*time.Second, "a connection of the Client subscribed", func() bool { return subscribers() >= 1 })
	time.Sleep(500 * time.Millisecond)
	if n := subscribers(); n != 1 {
		t.Errorf("%d connections of the Client subscribed with %d waiters, want 1", n, 3*names)
	}
	cancel()
	wg.Wait()
}

// sync.RWMutex's alternation: readers that waited for a writer all get in
// at its Unlock, even though another writer waits too; a reader that
// comes after that writer waits for it; the second writer gets in when
// those readers leave, then the late reader.
func TestAdvRWMutexAlternation(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		w1 := newClient(t, b).RWMutex(name)
		must(t, w1.Lock(ctx))
		type ev struct {
			who string
			err error
		}
		evs := make(chan ev, 8)
		var readers []*dsync.RWMutex
		for i := 0; i < 3; i++ {
			r := newClient(t, b).RWMutex(name)
			readers = append(readers, r)
			go func() { evs <- ev{"reader", r.RLock(ctx)} }()
		}
		waitFor(t, 10*time.Second, "three readers waiting", func() bool {
			n, _ := rdb.HLen(ctx, rwk(name).WaitingReaders).Result()
			return n == 3
		})
		w2 := newClient(t, b).RWMutex(name)
		go func() { evs <- ev{"writer", w2.Lock(ctx)} }()
		waitZCard(t, rdb, rwk(name).WaitingWriters, 1, "the second writer waiting")
		must(t, w1.Unlock(ctx))
		for i := 0; i < 3; i++ {
			select {
			case e := <-evs:
				if e.who != "reader" || e.err != nil {
					t.Fatalf("after the first writer's Unlock: %s %v, want the waiting readers", e.who, e.err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("waiting readers not let in by the writer's Unlock")
			}
		}
		late := newClient(t, b).RWMutex(name)
		if ok, _ := late.TryRLock(ctx); ok {
			t.Fatal("a late reader got in while the second writer waits")
		}
		go func() { evs <- ev{"late reader", late.RLock(ctx)} }()
		time.Sleep(200 * time.Millisecond)
		for _, r := range readers {
			select {
			case e := <-evs:
				t.Fatalf("%s got in (%v) while readers hold", e.who, e.err)
			default:
			}
			must(t, r.RUnlock(ctx))
		}
		select {
		case e := <-evs:
			if e.who != "writer" || e.err != nil {
				t.Fatalf("after the readers left: %s %v, want the second writer", e.who, e.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("second writer not in after the readers left")
		}
		select {
		case e := <-evs:
			t.Fatalf("%s got in (%v) while the second writer holds", e.who, e.err)
		case <-time.After(200 * time.Millisecond):
		}
		must(t, w2.Unlock(ctx))
		select {
		case e := <-evs:
			if e.who != "late reader" || e.err != nil {
				t.Fatalf("%s %v, want the late reader", e.who, e.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("late reader not in after the second writer left")
		}
		must(t, late.RUnlock(ctx))
		assertRWReleased(t, b, name)
	})
}

// scriptCopies returns the runs of script among those rec recorded,
// oldest first.
func scriptCopies(t *testing.T, rec *redistest.Recorder, script string) [][]any {
	t.Helper()
	hash := lua.Script(script).Hash()
	var out [][]any
	for _, a := range rec.All() {
		if len(a) > 1 && rwScriptHash(a) == hash {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no run of %s recorded", script)
	}
	return out
}

// Late copies of the end of a Once's run (go-redis re-sends a script after
// a read timeout; the first copy may arrive later): the end of a failed
// run that arrives while a later run is under way ends nothing, and the
// end of a successful run that arrives after a Reset does not mark the
// Once done again.
func TestAdvOnceLateEndOfRunChangesNothing(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c, rdb, rec := recorded(t, b)
		o := c.Once(name)
		rec.Reset()
		if err := o.Do(ctx, func(context.Context) error { return errors.New("fails") }); err == nil {
			t.Fatal("Do = nil, want f's error")
		}
		failedEnd := scriptCopies(t, rec, "once_release")
		started, finish := make(chan struct{}), make(chan error)
		second := make(chan error, 1)
		rec.Reset()
		go func() {
			second <- o.Do(ctx, func(context.Context) error { close(started); return <-finish })
		}()
		<-started
		runTok, err := rdb.HGet(ctx, onceKeys(name).Run, "t").Result()
		must(t, err)
		for _, a := range failedEnd {
			if _, err := rdb.Do(ctx, a...).Result(); err != nil && !errors.Is(err, redis.Nil) {
				t.Fatalf("late copy: %v", err)
			}
		}
		if tok, _ := rdb.HGet(ctx, onceKeys(name).Run, "t").Result(); tok != runTok {
			t.Fatalf("run hash token %q after the late copy, want %q (the run under way)", tok, runTok)
		}
		qctx, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
		err = newClient(t, b).Once(name).Do(qctx, func(context.Context) error {
			t.Error("f ran beside the run under way after a late copy of an earlier run's end")
			return nil
		})
		cancel()
		checkIs(t, err, context.DeadlineExceeded, "Do beside a run = %v, want DeadlineExceeded")
		finish <- nil
		must(t, <-second)
		successEnd := scriptCopies(t, rec, "once_release")
		must(t, o.Reset(ctx))
		for _, a := range successEnd {
			if _, err := rdb.Do(ctx, a...).Result(); err != nil && !errors.Is(err, redis.Nil) {
				t.Fatalf("late copy: %v", err)
			}
		}
		if done, err := o.Done(ctx); done || err != nil {
			t.Errorf("Done after Reset and a late copy of the success = %v, %v; want false", done, err)
		}
		ran := false
		must(t, o.Do(ctx, func(context.Context) error { ran = true; return nil }))
		if !ran {
			t.Error("f did not run after Reset: a late copy marked the Once done again")
		}
	})
}

// Script reentrancy spans processes: an owner that reads in one process
// and asks for the write lock in another (its token carried over) gets
// ErrUpgrade at once, not a wait for itself; one that writes in one
// process may read (downgrade) and re-enter in another.
func TestAdvRWMutexCarriedOwnerUpgradeAndDowngrade(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		a, c := newClient(t, b).RWMutex(name), newClient(t, b).RWMutex(name)
		octx := dsync.WithOwner(ctx)
		carried := dsync.WithOwnerToken(ctx, dsync.OwnerToken(octx))
		must(t, a.RLock(octx))
		lctx, cancel := context.WithTimeout(carried, 5*time.Second)
		mustIs(t, c.Lock(lctx), dsync.ErrUpgrade, "Lock by the reader's token elsewhere = %v, want ErrUpgrade")
		cancel()
		must(t, c.RUnlock(carried)) // the owner's one read level, from the other process
		// This process's record of the hold ended without its release:
		// lost, or not held; either way nothing is released.
		if err := a.RUnlock(octx); !errors.Is(err, dsync.ErrNotHeld) && !errors.Is(err, dsync.ErrLeaseLost) {
			t.Errorf("RUnlock after the owner's only level was released elsewhere = %v, want ErrNotHeld or ErrLeaseLost", err)
		}
		must(t, a.Lock(octx))
		must(t, c.RLock(carried))
		must(t, c.Lock(carried))
		must(t, a.Unlock(octx))
		must(t, c.Unlock(carried))
		if writeFree(t, ctx, newClient(t, b).RWMutex(name)) {
			t.Fatal("a writer got in beside the owner's read hold")
		}
		must(t, a.RUnlock(octx))
		if !writeFree(t, ctx, newClient(t, b).RWMutex(name)) {
			t.Fatal("not free after the owner's last release")
		}
		assertRWReleased(t, b, name)
	})
}

// A late copy of a Reset (go-redis re-sends a command after a read
// timeout; the first copy may arrive later) removes nothing: not the done
// mark of a run that succeeded after the Reset took effect, nor one set
// after a Reset of a Once that was not done.
func TestAdvOnceLateResetRemovesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, doneFirst := range []bool{true, false} {
			ctx := ctxT(t)
			name := fmt.Sprintf("%s-done=%v", redistest.Key(t), doneFirst)
			c, rdb, rec := recorded(t, b)
			o := c.Once(name)
			if doneFirst {
				must(t, o.Do(ctx, func(context.Context) error { return nil }))
			}
			rec.Reset()
			must(t, o.Reset(ctx))
			reset := scriptCopies(t, rec, "once_reset")
			must(t, o.Do(ctx, func(context.Context) error { return nil }))
			for _, a := range reset {
				if _, err := rdb.Do(ctx, a...).Result(); err != nil {
					t.Fatalf("late copy: %v", err)
				}
			}
			if done, err := o.Done(ctx); !done || err != nil {
				t.Errorf("done first %v: Done after a late copy of the Reset = %v, %v; want true", doneFirst, done, err)
			}
			must(t, o.Do(ctx, func(context.Context) error { t.Error("f ran again after a late copy of a Reset"); return nil }))
		}
	})
}

// A call that found the Once done at its first attempt: a late copy of
// that attempt (a go-redis retry's first copy, delayed) that arrives after
// the done mark is gone (Reset, or the end of a period) must take no run,
// which nobody would renew or end. go-redis sends a command again only
// after its read timeout: a check that took that long is remembered as
// over (one more round trip), one that did not writes nothing.
func TestAdvOnceLateCopyOfADoneCheck(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, slow := range []bool{false, true} {
			ctx := ctxT(t)
			name := fmt.Sprintf("%s-slow=%v", redistest.Key(t), slow)
			c, rdb, rec := recorded(t, b)
			var delay atomic.Int64
			rdb.AddHook(&delayedScripts{delay: &delay})
			// The slow check takes 300 ms against a read timeout of
			// 200 ms; the fast one is measured against a minute, so that a
			// stall of the loaded machine cannot make it slow.
			resent := time.Minute
			if slow {
				resent = 200 * time.Millisecond
			}
			dsync.SetResentAfter(c, resent)
			o := c.Once(name)
			must(t, o.Do(ctx, func(context.Context) error { return nil }))
			rec.Reset()
			if slow {
				delay.Store(int64(300 * time.Millisecond))
			}
			must(t, o.Do(ctx, func(context.Context) error { t.Error("f ran on a done Once"); return nil }))
			delay.Store(0)
			check := scriptCopies(t, rec, "once_do")
			if n := len(rec.All()); !slow && n != 1 {
				t.Errorf("a fast Do on a done Once sent %d scripts, want 1 (the check alone)", n)
			}
			if !slow {
				continue // go-redis sent it once: no copy can come late
			}
			must(t, o.Reset(ctx))
			for _, a := range check {
				if _, err := rdb.Do(ctx, a...).Result(); err != nil {
					t.Fatalf("late copy: %v", err)
				}
			}
			if n, _ := rdb.Exists(ctx, onceKeys(name).Run).Result(); n != 0 {
				pttl, _ := rdb.PTTL(ctx, onceKeys(name).Run).Result()
				t.Errorf("a late copy of a slow done check took a run (PTTL %v) that nobody runs", pttl)
			}
			ran := false
			must(t, o.Do(ctx, func(context.Context) error { ran = true; return nil }))
			if !ran {
				t.Error("after Reset and the late copy, Do did not run f")
			}
		}
	})
}

// delayedScripts is a go-redis hook that holds the reply of every script
// call by delay (0: none): a server or network slow to answer.
type delayedScripts struct{ delay *atomic.Int64 }

func (d *delayedScripts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (d *delayedScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			time.Sleep(time.Duration(d.delay.Load()))
		}
		return err
	}
}

func (d *delayedScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Redlock over 1, 2 and 4 masters (majorities 1, 2 and 3): one holder at a
// time, and a minority of masters granted never counts.
func TestAdvQuorumSizes(t *testing.T) {
	for _, n := range []int{1, 2, 4} {
		rdbs := miniMasters(t, n)
		ctx := ctxT(t)
		name := redistest.Key(t)
		q1, q2 := newQuorum(t, rdbs), newQuorum(t, rdbs)
		m1, m2 := q1.Mutex(name), q2.Mutex(name)
		l := lockLease(t, ctx, m1)
		if ok, err := m2.TryLock(ctx); ok || err != nil {
			t.Fatalf("n=%d: TryLock while held = %v, %v; want false", n, ok, err)
		}
		must(t, m1.Unlock(ctx))
		if l.Err() != nil {
			t.Errorf("n=%d: Lease.Err after Unlock = %v", n, l.Err())
		}
		// Held by another on a half of the masters: no majority is free.
		var cs []*dsync.Mutex
		for i := 0; i < n/2 && n > 1; i++ {
			c := dsync.New(rdbs[i])
			t.Cleanup(func() { c.Close() })
			m := c.Mutex(name)
			must(t, m.Lock(ctx))
			cs = append(cs, m)
		}
		ok, err := m2.TryLock(ctx)
		if want := n-len(cs) >= n/2+1; ok != want {
			t.Errorf("n=%d with %d masters held elsewhere: TryLock = %v, %v; want %v", n, len(cs), ok, err, want)
		}
		if ok {
			must(t, m2.Unlock(ctx))
		}
		for _, m := range cs {
			must(t, m.Unlock(ctx))
		}
		if ok, err := m2.TryLock(ctx); !ok || err != nil {
			t.Fatalf("n=%d: TryLock when free = %v, %v", n, ok, err)
		}
		must(t, m2.Unlock(ctx))
	}
}

// x/sync's TestAllocCancelDoesntStarve on one shared handle: a large
// Acquire waits behind the handle's own permit; TryAcquire fails once it
// is queued; when it gives up, a small Acquire through the same handle
// gets in at once.
func TestAdvSemaphoreAllocCancelDoesntStarve(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		name := redistest.Key(t)
		sem := newClient(t, b).Semaphore(name, 10)
		bg := ctxT(t)
		must(t, sem.Acquire(bg, 1))
		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		big := make(chan error, 1)
		go func() { big <- sem.Acquire(ctx, 10) }()
		queued := false
		for i := 0; i < 5000 && !queued; i++ {
			ok, err := sem.TryAcquire(bg, 1)
			must(t, err)
			if ok {
				must(t, sem.Release(bg, 1))
				time.Sleep(time.Millisecond)
			}
			queued = !ok
		}
		if !queued {
			t.Fatal("TryAcquire kept succeeding: the large Acquire never queued")
		}
		cancel()
		mustIs(t, <-big, context.Canceled, "the large Acquire = %v, want Canceled")
		small, scancel := context.WithTimeout(bg, 5*time.Second) // the TTL is 30 s
		defer scancel()
		if err := sem.Acquire(small, 1); err != nil {
			t.Fatalf("Acquire(1) after the large one gave up = %v", err)
		}
		if n, _ := b.NewClient(t).HGet(bg, semKeys(name).State, ":used").Int(); n != 2 {
			t.Errorf(":used = %d, want 2", n)
		}
		must(t, sem.Release(bg, 2))
		assertNoSemKeys(t, b, name)
	})
}

// "One round trip per operation": an uncontended take and release of
// every primitive is two round trips, a Once run two (take the run, end
// it) and a Do on a done Once one.
func TestAdvUncontendedRoundTrips(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		counter := &redistest.Counter{}
		c, _ := hookedClient(t, b, counter)
		m, rw, s, o := c.Mutex(name), c.RWMutex(name), c.Semaphore(name, 3), c.Once(name)
		octx := dsync.WithOwner(ctx)
		ops := []struct {
			what string
			want int64
			run  func() error
		}{
			{"Mutex Lock+Unlock", 2, func() error { must(t, m.Lock(ctx)); return m.Unlock(ctx) }},
			{"Mutex owner Lock+Unlock", 2, func() error { must(t, m.Lock(octx)); return m.Unlock(octx) }},
			{"RWMutex Lock+Unlock", 2, func() error { must(t, rw.Lock(ctx)); return rw.Unlock(ctx) }},
			{"RWMutex RLock+RUnlock", 2, func() error { must(t, rw.RLock(octx)); return rw.RUnlock(octx) }},
			{"Semaphore Acquire+Release", 2, func() error { must(t, s.Acquire(ctx, 2)); return s.Release(ctx, 2) }},
			{"Semaphore TryAcquire+Release", 2, func() error {
				ok, err := s.TryAcquire(octx, 3)
				must(t, err)
				if !ok {
					t.Fatal("TryAcquire on a free semaphore = false")
				}
				return s.Release(octx, 3)
			}},
			{"Once first Do", 2, func() error { return o.Do(ctx, func(context.Context) error { return nil }) }},
			{"Once Do when done", 1, func() error { return o.Do(ctx, func(context.Context) error { return nil }) }},
			{"Once Done", 1, func() error { _, err := o.Done(ctx); return err }},
		}
		for round := 0; round < 2; round++ {
			for _, op := range ops {
				if strings.HasPrefix(op.what, "Once first") {
					must(t, o.Reset(ctx))
				}
				counter.Reset()
				must(t, op.run())
				if n := counter.RoundTrips(); round == 1 && n != op.want {
					t.Errorf("%s: %d round trips, want %d", op.what, n, op.want)
				}
			}
		}
	})
}

// ClientReentrancy speaks of re-entries of locks: an owner's Acquires on a
// Semaphore made with it still count every permit in Redis, so the size
// holds across processes.
func TestAdvSemaphoreClientReentrancyCountsEveryPermit(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		octx := dsync.WithOwner(ctx)
		s := newClient(t, b, dsync.ClientReentrancy()).Semaphore(name, 3)
		must(t, s.Acquire(octx, 1))
		must(t, s.Acquire(octx, 1))
		if ok, _ := s.TryAcquire(octx, 1); !ok {
			t.Fatal("TryAcquire(1) with 2 of 3 held = false")
		}
		other := newClient(t, b).Semaphore(name, 3)
		if ok, _ := other.TryAcquire(ctx, 1); ok {
			t.Fatal("another holder got a permit with all 3 held by the owner")
		}
		if n, _ := b.NewClient(t).HGet(ctx, semKeys(name).State, ":used").Int(); n != 3 {
			t.Errorf(":used = %d, want 3", n)
		}
		must(t, s.Release(octx, 2))
		if ok, _ := other.TryAcquire(ctx, 2); !ok {
			t.Fatal("2 permits not free after the owner released 2 of 3")
		}
		must(t, other.Release(ctx, 2))
		must(t, s.Release(octx, 1))
		assertNoSemKeys(t, b, name)
	})
}

// A ring client is refused as bad input, before anything is sent. It was
// accepted, and the first Lock that had to wait panicked inside go-redis
// (Ring.Subscribe without a channel); a ring's pub/sub reaches one shard
// only, so waiters on the other shards would wait out their leases.
func TestAdvRingClientRefused(t *testing.T) {
	m1, m2 := redistest.Miniredis(t), redistest.Miniredis(t)
	counter := &redistest.Counter{}
	ring := func() redis.UniversalClient {
		r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": m1.Addrs[0], "b": m2.Addrs[0]}})
		r.AddHook(counter)
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	ctx := ctxT(t)
	c := dsync.New(ring())
	t.Cleanup(func() { c.Close() })
	q := dsync.NewQuorum([]redis.UniversalClient{m1.NewClient(t), ring(), m2.NewClient(t)})
	t.Cleanup(func() { q.Close() })
	for what, f := range map[string]func() error{
		"Client Mutex.Lock":      func() error { return c.Mutex("x").Lock(ctx) },
		"Client Semaphore":       func() error { return c.Semaphore("x", 2).Acquire(ctx, 1) },
		"Client Once":            func() error { return c.Once("x").Do(ctx, func(context.Context) error { return nil }) },
		"Client RWMutex.RLock":   func() error { return c.RWMutex("x").RLock(ctx) },
		"Quorum Mutex.Lock":      func() error { return q.Mutex("x").Lock(ctx) },
		"Quorum RWMutex.TryLock": func() error { _, err := q.RWMutex("x").TryLock(ctx); return err },
	} {
		checkIs(t, f(), dsync.ErrInvalid, what+" over a ring client = %v, want ErrInvalid")
	}
	if n := counter.RoundTrips(); n != 0 {
		t.Errorf("%d commands sent through the ring client, want 0", n)
	}
}

// redislock's concurrent obtain: many goroutines over several Clients try
// at once; exactly one gets a Mutex (an RWMutex's write lock), exactly
// size of them a permit of a Semaphore.
func TestAdvConcurrentTriesExactWinners(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		clients := []*dsync.Client{newClient(t, b), newClient(t, b), newClient(t, b), newClient(t, b)}
		const tries, rounds, size = 16, 5, 3
		for _, k := range []struct {
			kind holdKind
			want int
		}{{mutexHold, 1}, {writeHold, 1}, {semHold(size, 1), size}} {
			for r := 0; r < rounds; r++ {
				name := redistest.Key(t)
				var wg sync.WaitGroup
				var mu sync.Mutex
				var won []holdCalls
				start := make(chan struct{})
				for i := 0; i < tries; i++ {
					h := k.kind(clients[i%len(clients)], name)
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						ok, err := h.try(ctx)
						if err != nil {
							t.Error(err)
						}
						if ok {
							mu.Lock()
							won = append(won, h)
							mu.Unlock()
						}
					}()
				}
				close(start)
				wg.Wait()
				if len(won) != k.want {
					t.Fatalf("round %d: %d of %d tries won, want %d", r, len(won), tries, k.want)
				}
				for _, h := range won {
					must(t, h.unlock(ctx))
				}
			}
		}
	})
}

// A handle without an owner that reads twice holds two read holds:
// RUnlock releases the most recent, and RLease then gives the earlier.
func TestAdvRWMutexHandleReadHoldsLastInFirstOut(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		rw := newClient(t, b).RWMutex(name)
		must(t, rw.RLock(ctx))
		l1, err := rw.RLease(ctx)
		must(t, err)
		must(t, rw.RLock(ctx))
		l2, err := rw.RLease(ctx)
		must(t, err)
		if l1.Done() == l2.Done() {
			t.Fatal("two read holds share one Lease")
		}
		if n, _ := rdb.ZCard(ctx, rwk(name).Readers).Result(); n != 2 {
			t.Errorf("readers in Redis = %d, want 2", n)
		}
		must(t, rw.RUnlock(ctx))
		select {
		case <-l2.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the most recent read hold's Lease not done after RUnlock")
		}
		select {
		case <-l1.Done():
			t.Fatal("the earlier read hold ended with the most recent one's RUnlock")
		default:
		}
		if l, err := rw.RLease(ctx); err != nil || l.Done() != l1.Done() {
			t.Errorf("RLease after one RUnlock = %v, %v; want the earlier hold's", l, err)
		}
		if n, _ := rdb.ZCard(ctx, rwk(name).Readers).Result(); n != 1 {
			t.Errorf("readers in Redis = %d, want 1", n)
		}
		must(t, rw.RUnlock(ctx))
		checkIs(t, rw.RUnlock(ctx), dsync.ErrNotHeld, "third RUnlock = %v, want ErrNotHeld")
		if l1.Err() != nil || l2.Err() != nil {
			t.Errorf("Err after release = %v, %v; want nil", l1.Err(), l2.Err())
		}
		assertRWReleased(t, b, name)
	})
}

// After calls that fail in every documented way (refused tries, waiters
// cancelled by their deadline, an upgrade refused, a size mismatch,
// releases of more than held or of nothing, a Once run that fails) and
// ones that succeed (re-entries, a downgrade, partial releases, a Reset),
// the free name keeps only its fencing counters (within the idle expiry),
// call ids (within the replay window) and the Once's done mark (within its
// period).
func TestAdvNothingLeftAfterFailedCalls(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c1, c2 := newClient(t, b), newClient(t, b)
		o1, o2 := dsync.WithOwner(ctx), dsync.WithOwner(ctx)
		short := func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(o2, 50*time.Millisecond)
		}
		refused := func(what string, f func(context.Context) error) {
			t.Helper()
			sctx, cancel := short()
			defer cancel()
			if err := f(sctx); err == nil {
				t.Fatalf("%s succeeded", what)
			}
		}

		m1, m2 := c1.Mutex(name), c2.Mutex(name)
		for i := 0; i < 3; i++ {
			must(t, m1.Lock(o1))
		}
		if ok, err := m2.TryLock(o2); ok || err != nil {
			t.Fatalf("TryLock while held = %v, %v; want false, nil", ok, err)
		}
		refused("Lock while held", m2.Lock)
		for i := 0; i < 3; i++ {
			must(t, m1.Unlock(o1))
		}
		mustIs(t, m1.Unlock(o1), dsync.ErrNotHeld, "extra Unlock = %v, want ErrNotHeld")
		mustIs(t, m2.Unlock(ctx), dsync.ErrNotHeld, "Unlock of nothing = %v, want ErrNotHeld")

		rw1, rw2 := c1.RWMutex(name), c2.RWMutex(name)
		must(t, rw1.RLock(o1))
		mustIs(t, rw1.Lock(o1), dsync.ErrUpgrade, "upgrade = %v, want ErrUpgrade")
		refused("Lock while read", rw2.Lock)
		must(t, rw1.RUnlock(o1))
		must(t, rw1.Lock(o1))
		must(t, rw1.RLock(o1)) // a downgrade
		refused("RLock while written", rw2.RLock)
		must(t, rw1.Unlock(o1))
		must(t, rw1.RUnlock(o1))
		mustIs(t, rw1.RUnlock(o1), dsync.ErrNotHeld, "extra RUnlock = %v, want ErrNotHeld")

		s1, s2 := c1.Semaphore(name, 5), c2.Semaphore(name, 5)
		must(t, s1.Acquire(o1, 3))
		must(t, s1.Acquire(o1, 1))
		mustIs(t, c2.Semaphore(name, 4).Acquire(o2, 1), dsync.ErrSizeMismatch, "Acquire of another size = %v, want ErrSizeMismatch")
		if ok, err := s2.TryAcquire(o2, 2); ok || err != nil {
			t.Fatalf("TryAcquire past the size = %v, %v; want false, nil", ok, err)
		}
		refused("Acquire past the size", func(ctx context.Context) error { return s2.Acquire(ctx, 3) })
		mustIs(t, s1.Release(o1, 5), dsync.ErrNotHeld, "Release of more than held = %v, want ErrNotHeld")
		must(t, s1.Release(o1, 1))
		must(t, s1.Release(o1, 2))
		must(t, s1.Release(o1, 1))
		mustIs(t, s1.Release(o1, 1), dsync.ErrNotHeld, "extra Release = %v, want ErrNotHeld")

		once := c1.Once(name, dsync.Period(time.Minute))
		if err := once.Do(ctx, func(context.Context) error { return errors.New("fails") }); err == nil {
			t.Fatal("a failing run's Do returned nil")
		}
		must(t, once.Do(ctx, func(context.Context) error { return nil }))
		must(t, once.Reset(ctx))
		must(t, c2.Once(name, dsync.Period(time.Minute)).Do(ctx, func(context.Context) error { return nil }))

		dsync.WaitCleanups(c1)
		dsync.WaitCleanups(c2)
		rdb := b.NewClient(t)
		bound := map[string]time.Duration{
			mutexKeys(name).Fence: 24 * time.Hour, rwk(name).Fence: 24 * time.Hour,
			mutexKeys(name).Calls: time.Minute, rwk(name).Calls: time.Minute,
			semKeys(name).Calls: time.Minute, onceKeys(name).Calls: time.Minute,
			onceKeys(name).Done: time.Minute,
		}
		for _, k := range nameKeys(t, b, name) {
			ttl, err := rdb.PTTL(ctx, k).Result()
			must(t, err)
			max, ok := bound[k]
			switch {
			case !ok:
				dump, _ := rdb.Dump(ctx, k).Result()
				t.Errorf("key %s (PTTL %v) left on the free name: %q", k, ttl, dump)
			case ttl <= 0 || ttl > max:
				t.Errorf("key %s: PTTL %v, want an expiry within %v", k, ttl, max)
			}
		}
	})
}
