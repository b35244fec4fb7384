package dsync_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// Cohorts of RWMutex writers (cohort.go), what is their own: a writer's
// release passes the write lock to a writer waiting in its process only
// while no reader waits or holds. What they share with Mutex cohorts is
// tested in cohort_test.go (cohortKinds).

// rwCohort is the RWMutex write lock's cohortKind.
var rwCohort = cohortKinds[1]

func rwKeys(name string) keys.RWMutex { return keys.ForRWMutex(dsync.DefaultPrefix, name) }

// readerWaits starts an RLock of name on a Client of its own and returns
// its handle and its outcome once it waits in Redis (its waiting place).
func readerWaits(t *testing.T, b redistest.Backend, ctx context.Context, rdb redis.UniversalClient, name string) (*dsync.RWMutex, <-chan error) {
	t.Helper()
	r := newClient(t, b).RWMutex(name)
	read := async(func() error { return r.RLock(ctx) })
	waitFor(t, 10*time.Second, "the reader's waiting place", func() bool {
		n, err := rdb.HLen(ctx, rwKeys(name).WaitingReaders).Result()
		return err == nil && n == 1
	})
	return r, read
}

// A writer's release admits the readers that waited for it rather than
// pass the write lock on: a reader of another Client holds before the
// writer waiting in the releaser's process, which gets in once the reader
// leaves.
func TestCohortRWMutexWaitingReaderGoesFirst(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		rdb := b.NewClient(t)
		a, w := c.RWMutex(name), c.RWMutex(name)
		must(t, a.Lock(ctx))
		r, read := readerWaits(t, b, ctx, rdb, name)
		write := async(func() error { return w.Lock(ctx) })
		rwCohort.waiting(t, c, name, 1)
		must(t, a.Unlock(ctx))
		recvNil(t, read, 10*time.Second, "the waiting reader")
		select {
		case err := <-write:
			t.Fatalf("the writer waiting in the releaser's process got in (%v) while the reader holds", err)
		case <-time.After(200 * time.Millisecond):
		}
		if n, err := rdb.Exists(ctx, rwKeys(name).Writer).Result(); err != nil || n != 0 {
			t.Fatalf("a write hold in Redis while the reader holds: %v, %v", n, err)
		}
		must(t, r.RUnlock(ctx))
		recvNil(t, write, 10*time.Second, "the writer, once the reader left")
		must(t, w.Unlock(ctx))
	})
}

// A writer waiting in the releaser's process that a release passes over
// for the readers that waited holds back the readers that come after it,
// as a writer waiting in Redis does (writer preference): the release gives
// it the waiting place its own refused attempt would take, so a new
// reader of another Client is refused from the moment the Unlock returns,
// before the writer made an attempt of its own (held back here by a gate
// on the lock script, opened once the reader that waited holds). The
// writer gets in once that reader leaves.
func TestCohortRWMutexPassedOverWriterHoldsBackNewReaders(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		gate := &unlockGate{sha: lua.Script("rwmutex_lock").Hash()}
		c, rdb := hookedClient(t, b, gate)
		a, w := c.RWMutex(name), c.RWMutex(name)
		must(t, a.Lock(ctx))
		write := async(func() error { return w.Lock(ctx) })
		rwCohort.waiting(t, c, name, 1)
		gate.close()
		defer gate.open()
		r, read := readerWaits(t, b, ctx, rdb, name)
		must(t, a.Unlock(ctx))
		late := newClient(t, b).RWMutex(name)
		if ok, err := late.TryRLock(ctx); err != nil || ok {
			t.Fatalf("a reader that came after the waiting writer: TryRLock = %v, %v; want false (writer preference)", ok, err)
		}
		if n, err := rdb.ZCard(ctx, rwKeys(name).WaitingWriters).Result(); err != nil || n != 1 {
			t.Fatalf("waiting writers in Redis after the release: %v, %v; want 1", n, err)
		}
		recvNil(t, read, 10*time.Second, "the reader that waited")
		if ok, err := late.TryRLock(ctx); err != nil || ok {
			t.Fatalf("a new reader while the writer waits and the reader holds: TryRLock = %v, %v; want false", ok, err)
		}
		gate.open()
		if ok, err := late.TryRLock(ctx); err != nil || ok {
			t.Fatalf("a new reader once the writer tries in Redis: TryRLock = %v, %v; want false", ok, err)
		}
		must(t, r.RUnlock(ctx))
		recvNil(t, write, 10*time.Second, "the writer, once the reader left")
		must(t, w.Unlock(ctx))
		ok, err := late.TryRLock(ctx)
		if err != nil || !ok {
			t.Fatalf("TryRLock once the writer left: %v, %v; want true", ok, err)
		}
		must(t, late.RUnlock(ctx))
	})
}

// The waiting place a release gave a writer waiting in its process (see
// TestCohortRWMutexPassedOverWriterHoldsBackNewReaders) goes with the
// writer when its Lock gives up: new readers get in at once, not after the
// place lapses (one lease TTL, 30 s here).
func TestCohortRWMutexPassedOverWriterGivesUp(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		rdb := b.NewClient(t)
		a, w := c.RWMutex(name), c.RWMutex(name)
		must(t, a.Lock(ctx))
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		write := async(func() error { return w.Lock(wctx) })
		rwCohort.waiting(t, c, name, 1)
		r, read := readerWaits(t, b, ctx, rdb, name)
		must(t, a.Unlock(ctx))
		recvNil(t, read, 10*time.Second, "the reader that waited")
		cancel()
		select {
		case err := <-write:
			mustIs(t, err, context.Canceled, "the writer that gave up")
		case <-time.After(10 * time.Second):
			t.Fatal("the writer's Lock did not return after its ctx was cancelled")
		}
		waitFor(t, 10*time.Second, "the writer's waiting place to go", func() bool {
			n, err := rdb.Exists(ctx, rwKeys(name).WaitingWriters).Result()
			return err == nil && n == 0
		})
		late := newClient(t, b).RWMutex(name)
		ok, err := late.TryRLock(ctx)
		if err != nil || !ok {
			t.Fatalf("TryRLock once the writer gave up: %v, %v; want true", ok, err)
		}
		must(t, late.RUnlock(ctx))
		must(t, r.RUnlock(ctx))
	})
}

// The writer waiting in the process gives up while the release that
// passes it over for a waiting reader is on its way (held at a gate): the
// release, which gave it a waiting place, undoes that place, so a new
// reader gets in once the release is over, not after the place lapses (30
// s here).
func TestCohortRWMutexPassedOverWriterGivesUpDuringTheRelease(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		gate := &unlockGate{sha: lua.Script("rwmutex_unlock").Hash()}
		c, rdb := hookedClient(t, b, gate)
		a, w := c.RWMutex(name), c.RWMutex(name)
		must(t, a.Lock(ctx))
		must(t, a.Unlock(ctx)) // the unlock script loaded
		must(t, a.Lock(ctx))
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		write := async(func() error { return w.Lock(wctx) })
		rwCohort.waiting(t, c, name, 1)
		r, read := readerWaits(t, b, ctx, rdb, name)
		gate.close()
		defer gate.open()
		unlocked := async(func() error { return a.Unlock(ctx) })
		waitFor(t, 10*time.Second, "the release, held at the gate", func() bool { return gate.held.Load() == 1 })
		cancel()
		select {
		case err := <-write:
			mustIs(t, err, context.Canceled, "the writer that gave up")
		case <-time.After(10 * time.Second):
			t.Fatal("the writer's Lock did not return after its ctx was cancelled")
		}
		gate.open()
		recvNil(t, unlocked, 10*time.Second, "the release")
		recvNil(t, read, 10*time.Second, "the reader that waited")
		dsync.WaitCleanups(c)
		if n, err := rdb.Exists(ctx, rwKeys(name).WaitingWriters).Result(); err != nil || n != 0 {
			t.Fatalf("waiting writers in Redis after the writer gave up: %v, %v; want none", n, err)
		}
		late := newClient(t, b).RWMutex(name)
		ok, err := late.TryRLock(ctx)
		if err != nil || !ok {
			t.Fatalf("TryRLock once the writer gave up: %v, %v; want true", ok, err)
		}
		must(t, late.RUnlock(ctx))
		must(t, r.RUnlock(ctx))
	})
}

// A writer's release does not pass the write lock on while a read hold
// lives in Redis. No reader of dsync's holds with a writer of a handle
// without owner (a downgrade needs an owner, whose calls are no cohort
// members), so the read hold is written here as dsync writes one, lasting
// 5 s (far beyond the few steps that follow, also on a loaded machine):
// the waiting writer gets in once it lapses, not before.
func TestCohortRWMutexNoPassWhileAReaderHolds(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		rdb := b.NewClient(t)
		a, w := c.RWMutex(name), c.RWMutex(name)
		must(t, a.Lock(ctx))
		write := async(func() error { return w.Lock(ctx) })
		rwCohort.waiting(t, c, name, 1)
		now, err := rdb.Time(ctx).Result()
		must(t, err)
		lapses := now.Add(5 * time.Second)
		k := rwKeys(name)
		must(t, rdb.ZAdd(ctx, k.Readers, redis.Z{Score: float64(lapses.UnixMilli()), Member: "reader"}).Err())
		must(t, rdb.HSet(ctx, k.ReaderData, "reader", "1 7 call").Err())
		must(t, rdb.PExpire(ctx, k.Readers, 10*time.Second).Err())
		must(t, rdb.PExpire(ctx, k.ReaderData, 10*time.Second).Err())
		must(t, a.Unlock(ctx))
		select {
		case err := <-write:
			t.Fatalf("the waiting writer got in (%v) while a read hold lives", err)
		case <-time.After(300 * time.Millisecond):
		}
		if n, err := rdb.Exists(ctx, k.Writer).Result(); err != nil || n != 0 {
			t.Fatalf("a write hold in Redis while a read hold lives: %v, %v", n, err)
		}
		recvNil(t, write, 20*time.Second, "the writer, once the read hold lapsed")
		if ms, err := rdb.Time(ctx).Result(); err != nil || ms.Before(lapses) {
			t.Fatalf("the writer got in at %v, before the read hold lapsed (%v): %v", ms, lapses, err)
		}
		must(t, w.Unlock(ctx))
	})
}

// Writers and readers of two Clients: a writer is alone, and every write
// hold's token, as Redis has it while the hold lives, is larger than the
// last.
func TestCohortRWMutexWritersAndReaders(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const writers, rounds = 4, 20
		rdb := b.NewClient(t)
		var (
			writing, reading atomic.Int32
			mu               sync.Mutex
			last             uint64
			wg               sync.WaitGroup
			errs             = make(chan error, 2*(writers+1))
		)
		fail := func(err error) { errs <- err }
		for range 2 {
			c := newClient(t, b)
			for range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rw := c.RWMutex(name)
					for range rounds {
						if err := rw.Lock(ctx); err != nil {
							fail(err)
							return
						}
						if n := writing.Add(1); n != 1 || reading.Load() != 0 {
							fail(errors.New("a writer not alone"))
							return
						}
						l, err := rw.Lease(ctx)
						if err != nil {
							fail(err)
							return
						}
						if f := rwCohort.fence(t, rdb, name); f != strconv.FormatUint(l.Token(), 10) {
							fail(errors.New("Redis holds write token " + f + ", the holder " + strconv.FormatUint(l.Token(), 10)))
							return
						}
						mu.Lock()
						if l.Token() <= last {
							mu.Unlock()
							fail(errors.New("write token did not rise"))
							return
						}
						last = l.Token()
						mu.Unlock()
						writing.Add(-1)
						if err := rw.Unlock(ctx); err != nil {
							fail(err)
							return
						}
					}
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				rw := c.RWMutex(name)
				for range rounds / 2 {
					if err := rw.RLock(ctx); err != nil {
						fail(err)
						return
					}
					reading.Add(1)
					if writing.Load() != 0 {
						fail(errors.New("a reader inside with a writer"))
						return
					}
					time.Sleep(time.Millisecond)
					reading.Add(-1)
					if err := rw.RUnlock(ctx); err != nil {
						fail(err)
						return
					}
				}
			}()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case err := <-errs:
			t.Fatal(err)
		case <-time.After(60 * time.Second):
			t.Fatal("writers and readers did not finish in 60 s")
		}
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
	})
}
