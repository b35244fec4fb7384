package dsync_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// These tests send a copy of a script that already ran, as go-redis does
// when it re-sends a script after a read timeout and the first copy reaches
// the server later: after the call returned, after many other calls of the
// same owner, after the hold ended, or seconds later. Within the replay
// window (60 s) a copy changes nothing, however many calls came in
// between; an unlock names the hold it ends, so its copy never ends a later
// hold, whenever it arrives.

// replayTTL is the lease of the holds in these tests: long enough that no
// hold expires when a test moves miniredis's clock past the replay window.
const replayTTL = 10 * time.Minute

// replayRig is one owner's Client whose scripts are recorded, and another
// Client on the same backend.
type replayRig struct {
	b     redistest.Backend
	rdb   redis.UniversalClient
	rec   *redistest.Recorder
	c     *dsync.Client
	other *dsync.Client
	ctx   context.Context // with the owner
	octx  context.Context // with another owner
	name  string
}

func newReplayRig(t *testing.T, b redistest.Backend) *replayRig {
	t.Helper()
	rec := &redistest.Recorder{}
	c, rdb := hookedClient(t, b, rec, dsync.TTL(replayTTL))
	return &replayRig{
		b:     b,
		rdb:   rdb,
		rec:   rec,
		c:     c,
		other: newClient(t, b, dsync.TTL(replayTTL)),
		ctx:   dsync.WithOwner(ctxT(t)),
		octx:  dsync.WithOwner(ctxT(t)),
		name:  redistest.Key(t),
	}
}

// record runs call with the owner's ctx and returns the arguments of the
// last run of script it sent.
func (r *replayRig) record(t *testing.T, script *redis.Script, call func(context.Context) error) []any {
	t.Helper()
	return r.recordErr(t, script, func(ctx context.Context) error {
		must(t, call(ctx))
		return nil
	})
}

// recordErr is record for a call whose outcome the test checks itself.
func (r *replayRig) recordErr(t *testing.T, script *redis.Script, call func(context.Context) error) []any {
	t.Helper()
	r.rec.Reset()
	_ = call(r.ctx)
	all := r.rec.All()
	for i := len(all) - 1; i >= 0; i-- {
		if a := all[i]; len(a) > 1 && rwScriptHash(a) == script.Hash() {
			return a
		}
	}
	t.Fatalf("no run of the script recorded among %d scripts", len(all))
	return nil
}

// send sends a recorded script copy and returns the raw reply.
func (r *replayRig) send(t *testing.T, args []any) any {
	t.Helper()
	v, err := r.rdb.Do(context.Background(), args...).Result()
	if err != nil {
		t.Fatalf("script copy: %v", err)
	}
	return v
}

// withCallID returns a copy of the recorded script args with the call id,
// ARGV[argv] (from 1) of a script with nkeys keys, replaced: the copy of a
// call whose id the server no longer remembers.
func withCallID(args []any, nkeys, argv int, id string) []any {
	c := append([]any(nil), args...)
	c[3+nkeys+argv-1] = id
	return c
}

// code is the first element of a script's array reply, or the reply itself
// when it is a number; -1 otherwise.
func code(v any) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case []any:
		if len(v) > 0 {
			if n, ok := v[0].(int64); ok {
				return n
			}
		}
	}
	return -1
}

// rwCount returns the owner's reentry count in Redis for mode "r" or "w".
func (r *replayRig) rwCount(t *testing.T, mode string) int {
	t.Helper()
	tok := dsync.OwnerToken(r.ctx)
	ctx := context.Background()
	var v string
	if mode == "w" {
		v, _ = r.rdb.HGet(ctx, rwk(r.name).Writer, tok).Result()
	} else {
		// "<count> <hold id> <call ids>"
		v, _ = r.rdb.HGet(ctx, rwk(r.name).ReaderData, tok).Result()
		v, _, _ = strings.Cut(v, " ")
	}
	n, _ := strconv.Atoi(v)
	return n
}

// otherWrites reports whether another owner can take rw's write lock now,
// and leaves it free.
func (r *replayRig) otherWrites(t *testing.T) bool {
	t.Helper()
	return writeFree(t, r.octx, r.other.RWMutex(r.name))
}

func rwOps(rw *dsync.RWMutex, mode string) (lock, unlock func(context.Context) error) {
	if mode == "r" {
		return rw.RLock, rw.RUnlock
	}
	return rw.Lock, rw.Unlock
}

// A late copy of an RWMutex Unlock or RUnlock that lowered the owner's
// count, sent after 40 other holds of the same owner (re-entries of one
// hold, or holds of their own), changes nothing.
func TestRWMutexLateUnlockCopyAfter40Holds(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, mode := range []string{"w", "r"} {
			for _, within := range []bool{true, false} {
				r := newReplayRig(t, b)
				rw := r.c.RWMutex(r.name)
				lock, unlock := rwOps(rw, mode)
				must(t, lock(r.ctx))
				must(t, lock(r.ctx))
				// The Unlock whose first copy arrives late: it lowers the
				// count to 1.
				args := r.record(t, lua.Script("rwmutex_unlock"), unlock)
				want := 1 // the owner's count when the copy arrives
				if !within {
					// The hold ends; 40 holds of their own follow.
					must(t, unlock(r.ctx))
					want = 0
				}
				for i := 0; i < 40; i++ {
					must(t, lock(r.ctx))
					must(t, unlock(r.ctx))
				}
				must(t, lock(r.ctx))
				want++
				if got := code(r.send(t, args)); got != 2 {
					t.Errorf("%s within=%v: late copy of the Unlock replied %d, want 2 as the first time", mode, within, got)
				}
				if got := r.rwCount(t, mode); got != want {
					t.Errorf("%s within=%v: count after the late copy = %d, want %d", mode, within, got, want)
				}
				unlockLevels(t, want, func() bool { return r.otherWrites(t) }, func() error { return unlock(r.ctx) },
					fmt.Sprintf("%s within=%v", mode, within))
				assertRWReleased(t, b, r.name)
			}
		}
	})
}

// A late copy of a Semaphore Release that lowered a holding, sent after 40
// other Acquires and Releases of the same holding, changes nothing.
func TestSemaphoreLateReleaseCopyAfter40Acquires(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		r := newReplayRig(t, b)
		const size = 4
		s := r.c.Semaphore(r.name, size)
		must(t, s.Acquire(r.ctx, 1))
		must(t, s.Acquire(r.ctx, 1))
		release := func(ctx context.Context) error { return s.Release(ctx, 1) }
		args := r.record(t, lua.Script("semaphore_release"), release)
		for i := 0; i < 40; i++ {
			must(t, s.Acquire(r.ctx, 1))
			must(t, s.Release(r.ctx, 1))
		}
		must(t, s.Acquire(r.ctx, 1))
		if got := code(r.send(t, args)); got != 1 {
			t.Errorf("late copy of the Release replied %d, want 1 as the first time", got)
		}
		held := func() int {
			n, _ := r.rdb.HGet(context.Background(), semKeys(r.name).State, dsync.OwnerToken(r.ctx)).Int()
			return n
		}
		if got := held(); got != 2 {
			t.Fatalf("permits held after the late copy = %d, want 2", got)
		}
		o := r.other.Semaphore(r.name, size)
		if ok, err := o.TryAcquire(r.octx, size-1); err != nil || ok {
			t.Fatalf("another holder's TryAcquire(%d) = %v, %v; want false: 2 permits are held", size-1, ok, err)
		}
		must(t, s.Release(r.ctx, 2))
		if ok, err := o.TryAcquire(r.octx, size); err != nil || !ok {
			t.Fatalf("TryAcquire(%d) after the last Release = %v, %v; want true", size, ok, err)
		}
		must(t, o.Release(r.octx, size))
		assertNoSemKeys(t, b, r.name)
	})
}

// A late copy of a Mutex lock call that completed (a Lock, also a
// re-entry, or a TryLock that was refused) arrives after the hold ended, or
// after the name became free: it takes no hold, which no one would renew
// or release, and no queue place.
func TestMutexLateLockCopyTakesNoGhostHold(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		r := newReplayRig(t, b)
		m := r.c.Mutex(r.name)
		script := lua.Script("mutex_lock")
		fresh := r.record(t, script, m.Lock)
		reentry := r.record(t, script, m.Lock)
		must(t, m.Unlock(r.ctx))
		must(t, m.Unlock(r.ctx))
		for _, args := range [][]any{fresh, reentry} {
			if got := code(r.send(t, args)); got == 1 || got == 2 {
				t.Errorf("late copy of a completed Lock replied %d, want refused", got)
			}
		}
		if n := reentryCount(t, b, r.name, dsync.OwnerToken(r.ctx)); n != 0 {
			t.Errorf("count after the late copies = %d, want 0", n)
		}
		o := r.other.Mutex(r.name)
		ok, err := o.TryLock(r.octx)
		if err != nil || !ok {
			t.Fatalf("another owner's TryLock after the late copies = %v, %v: a late copy took a hold nobody releases", ok, err)
		}
		// A TryLock refused while another owner holds; its late copy
		// arrives once the name is free.
		refused := r.record(t, script, func(ctx context.Context) error {
			if ok, err := m.TryLock(ctx); err != nil || ok {
				t.Fatalf("TryLock while another owner holds = %v, %v; want false", ok, err)
			}
			return nil
		})
		must(t, o.Unlock(r.octx))
		if got := code(r.send(t, refused)); got == 1 || got == 2 {
			t.Errorf("late copy of a refused TryLock replied %d, want refused", got)
		}
		if ok, err := o.TryLock(r.octx); err != nil || !ok {
			t.Fatalf("another owner's TryLock after the late copy = %v, %v: it took a hold nobody releases", ok, err)
		}
		must(t, o.Unlock(r.octx))
	})
}

// A late copy of a Mutex Lock that took a fresh hold arrives after that
// hold ended without an Unlock (its lease ran out; here its key is
// removed): at once, after another owner's hold, or after 40 of them. It
// takes no hold and no queue place.
func TestMutexLateLockCopyAfterLostHoldTakesNoGhostHold(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, between := range []int{0, 1, 40} {
			t.Run(fmt.Sprintf("holds_between=%d", between), func(t *testing.T) {
				r := newReplayRig(t, b)
				m := r.c.Mutex(r.name)
				fresh := r.record(t, lua.Script("mutex_lock"), m.Lock)
				must(t, r.rdb.Del(context.Background(), mutexKeys(r.name).Lock).Err())
				o := r.other.Mutex(r.name)
				for i := 0; i < between; i++ {
					must(t, o.Lock(r.octx))
					must(t, o.Unlock(r.octx))
				}
				if got := code(r.send(t, fresh)); got == 1 || got == 2 {
					t.Errorf("late copy of a Lock whose hold was lost replied %d, want no hold", got)
				}
				ok, err := o.TryLock(r.octx)
				if err != nil || !ok {
					t.Fatalf("another owner's TryLock after the late copy = %v, %v: the copy took a hold nobody releases", ok, err)
				}
				must(t, o.Unlock(r.octx))
				if n, _ := r.rdb.Exists(context.Background(), mutexKeys(r.name).Queue).Result(); n != 0 {
					t.Errorf("queue exists after the late copy: it took a place")
				}
			})
		}
	})
}

// A late copy of an RWMutex Lock that took a fresh write hold arrives after
// that hold ended without an Unlock (its key is removed): at once, while
// another owner reads, or after 40 write holds of another owner. It takes
// no hold and no waiting place (which would hold new readers back).
func TestRWMutexLateLockCopyAfterLostHoldTakesNoGhostHold(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, between := range []string{"none", "reader", "40 writers"} {
			t.Run(between, func(t *testing.T) {
				r := newReplayRig(t, b)
				rw := r.c.RWMutex(r.name)
				fresh := r.record(t, lua.Script("rwmutex_lock"), rw.Lock)
				ctx := context.Background()
				must(t, r.rdb.Del(ctx, rwk(r.name).Writer).Err())
				o := r.other.RWMutex(r.name)
				switch between {
				case "reader":
					must(t, o.RLock(r.octx))
				case "40 writers":
					for i := 0; i < 40; i++ {
						must(t, o.Lock(r.octx))
						must(t, o.Unlock(r.octx))
					}
				}
				if got := code(r.send(t, fresh)); got == 1 || got == 2 {
					t.Errorf("late copy of a Lock whose hold was lost replied %d, want no hold", got)
				}
				if n, _ := r.rdb.Exists(ctx, rwk(r.name).WaitingWriters).Result(); n != 0 {
					t.Errorf("waiting writers exist after the late copy: it took a place")
				}
				if between == "reader" {
					must(t, o.RUnlock(r.octx))
				}
				if !r.otherWrites(t) {
					t.Fatalf("another owner cannot write after the late copy: the copy took a hold nobody releases")
				}
			})
		}
	})
}

// A late copy of the Lock that began a Mutex hold, or an RWMutex write
// hold, arrives while the hold lasts, after 20 re-entries of the owner
// (more than the hold's list of recent calls keeps): it changes nothing.
func TestLateLockCopyAfter20ReentriesChangesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, kind := range []string{"Mutex", "RWMutex"} {
			t.Run(kind, func(t *testing.T) {
				r := newReplayRig(t, b)
				script, h := lua.Script("mutex_lock"), locker(r.c.Mutex(r.name))
				count := func() int { return reentryCount(t, b, r.name, dsync.OwnerToken(r.ctx)) }
				if kind == "RWMutex" {
					script, h = lua.Script("rwmutex_lock"), r.c.RWMutex(r.name)
					count = func() int { return r.rwCount(t, "w") }
				}
				fresh := r.record(t, script, h.Lock)
				const reentries = 20
				for i := 0; i < reentries; i++ {
					must(t, h.Lock(r.ctx))
				}
				if got := code(r.send(t, fresh)); got != 2 {
					t.Errorf("late copy of the Lock that began the hold replied %d, want 2 (held by it already)", got)
				}
				if n := count(); n != reentries+1 {
					t.Errorf("count after the late copy = %d, want %d", n, reentries+1)
				}
				for i := 0; i <= reentries; i++ {
					must(t, h.Unlock(r.ctx))
				}
			})
		}
	})
}

// A late copy of a Semaphore Acquire that completed (or of a TryAcquire that
// was refused) arrives after the permits came back: it takes none.
func TestSemaphoreLateAcquireCopyTakesNoGhostHold(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		r := newReplayRig(t, b)
		const size = 3
		s := r.c.Semaphore(r.name, size)
		script := lua.Script("semaphore_acquire")
		fresh := r.record(t, script, func(ctx context.Context) error { return s.Acquire(ctx, 2) })
		added := r.record(t, script, func(ctx context.Context) error { return s.Acquire(ctx, 1) })
		must(t, s.Release(r.ctx, 3))
		for _, args := range [][]any{fresh, added} {
			if got := code(r.send(t, args)); got == 1 || got == 2 {
				t.Errorf("late copy of a completed Acquire replied %d, want refused", got)
			}
		}
		o := r.other.Semaphore(r.name, size)
		if ok, err := o.TryAcquire(r.octx, size); err != nil || !ok {
			t.Fatalf("TryAcquire(%d) after the late copies = %v, %v; want true: a copy took permits nobody releases", size, ok, err)
		}
		// A TryAcquire refused while the other holds everything; its late
		// copy arrives once the permits are back.
		refused := r.record(t, script, func(ctx context.Context) error {
			if ok, err := s.TryAcquire(ctx, 1); err != nil || ok {
				t.Fatalf("TryAcquire while all permits are held = %v, %v; want false", ok, err)
			}
			return nil
		})
		must(t, o.Release(r.octx, size))
		if got := code(r.send(t, refused)); got == 1 || got == 2 {
			t.Errorf("late copy of a refused TryAcquire replied %d, want refused", got)
		}
		if ok, err := o.TryAcquire(r.octx, size); err != nil || !ok {
			t.Fatalf("TryAcquire(%d) after the late copy = %v, %v; want true", size, ok, err)
		}
		must(t, o.Release(r.octx, size))
		assertNoSemKeys(t, b, r.name)
	})
}

// A copy of an RWMutex call that arrives 11 s late changes nothing (the old
// memory of finished calls lasted 10 s). On miniredis the clock moves; on a
// real server the copy is sent at once, and the copy of an unlock is also
// sent under a call id the server never saw, as if the replay window had
// passed: it names the hold it ended, so it cannot end the owner's next
// hold.
func TestRWMutexLateCopyAfter11s(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, mode := range []string{"w", "r"} {
			r := newReplayRig(t, b)
			rw := r.c.RWMutex(r.name)
			lock, unlock := rwOps(rw, mode)
			lockArgs := r.record(t, lua.Script("rwmutex_lock"), lock)
			unlockArgs := r.record(t, lua.Script("rwmutex_unlock"), unlock)
			must(t, lock(r.ctx)) // the owner's next hold
			if b.Mini != nil {
				b.Advance(11 * time.Second)
			}
			if got := code(r.send(t, unlockArgs)); got != 1 {
				t.Errorf("%s: copy of the Unlock 11 s late replied %d, want 1 as the first time", mode, got)
			}
			if got := r.rwCount(t, mode); got != 1 {
				t.Fatalf("%s: the copy of the Unlock 11 s late ended the owner's next hold (count %d, want 1)", mode, got)
			}
			// The hold that Lock took has ended: the copy is over (5), or
			// refused; never granted the owner's next hold (2), which has
			// nothing of it.
			if got := code(r.send(t, lockArgs)); got != 5 && got != 0 {
				t.Errorf("%s: copy of the Lock 11 s late replied %d, want over (5) or refused: the hold it took ended", mode, got)
			}
			if got := r.rwCount(t, mode); got != 1 {
				t.Fatalf("%s: count after the copy of the Lock = %d, want 1 (the next hold, untouched)", mode, got)
			}
			// Past the replay window the unlock's copy is still harmless.
			if b.Mini != nil {
				b.Advance(61 * time.Second)
			} else {
				unlockArgs = withCallID(unlockArgs, rwKeyCount, 3, "a-forgotten-call")
			}
			// It answers as before, finds nothing of its own (0), or, on
			// miniredis whose clock moved past its bound, is refused as
			// stale (6): every unlock carries a bound.
			if got := code(r.send(t, unlockArgs)); got != 0 && got != 1 && got != 6 {
				t.Errorf("%s: copy of the Unlock past the window replied %d, want 0, 1 or 6", mode, got)
			}
			if got := r.rwCount(t, mode); got != 1 {
				t.Fatalf("%s: the copy of the Unlock past the window ended the owner's next hold (count %d, want 1)", mode, got)
			}
			if r.otherWrites(t) {
				t.Fatalf("%s: another owner took the write lock while the owner holds it", mode)
			}
			must(t, unlock(r.ctx))
			if !r.otherWrites(t) {
				t.Fatalf("%s: write lock not free after the owner's Unlock", mode)
			}
		}
	})
}
