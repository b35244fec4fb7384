package dsync_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// Each test below replays a script exactly as go-redis re-sends it after a
// read timeout, but late: after other calls of the same owner ran. A repeat
// must change nothing and answer as the first run did.

// recorded returns a Client whose scripts are recorded, the raw client to
// replay them on, and the recorder.
func recorded(t *testing.T, b redistest.Backend) (*dsync.Client, redis.UniversalClient, *redistest.Recorder) {
	t.Helper()
	rec := &redistest.Recorder{}
	c, rdb := hookedClient(t, b, rec)
	return c, rdb, rec
}

func reentryCount(t *testing.T, b redistest.Backend, name, tok string) int {
	t.Helper()
	n, err := b.NewClient(t).HGet(context.Background(), mutexKeys(name).Lock, tok).Int()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return n
}

// eachRecordedMutex runs f on each backend with a Mutex of a fresh name on
// a Client whose scripts rec records, the raw client rdb to replay them on,
// and a ctx that has an owner if owned.
func eachRecordedMutex(t *testing.T, owned bool, f func(t *testing.T, b redistest.Backend, ctx context.Context, name string, m *dsync.Mutex, rdb redis.UniversalClient, rec *redistest.Recorder)) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		c, rdb, rec := recorded(t, b)
		name := redistest.Key(t)
		ctx := ctxT(t)
		if owned {
			ctx = dsync.WithOwner(ctx)
		}
		f(t, b, ctx, name, c.Mutex(name), rdb, rec)
	})
}

// replayAsBefore sends the recorded script call args again on rdb and
// checks that it answers want, as its first run did.
func replayAsBefore(t *testing.T, ctx context.Context, rdb redis.UniversalClient, args []any, want int64, what string) {
	t.Helper()
	if v, err := rdb.Do(ctx, args...).Int64(); err != nil || v != want {
		t.Fatalf("replayed %s = %v, %v; want %d (as before)", what, v, err, want)
	}
}

// assertLevelsAfterRetry checks that ctx's owner holds name's Mutex at want
// levels after a late retry.
func assertLevelsAfterRetry(t *testing.T, b redistest.Backend, ctx context.Context, name string, want int) {
	t.Helper()
	if n := reentryCount(t, b, name, dsync.OwnerToken(ctx)); n != want {
		t.Fatalf("count after the late retry = %d, want %d", n, want)
	}
}

func TestMutexUnlockRetriedLateChangesNothing(t *testing.T) {
	eachRecordedMutex(t, true, func(t *testing.T, b redistest.Backend, ctx context.Context, name string, m *dsync.Mutex, rdb redis.UniversalClient, rec *redistest.Recorder) {
		for i := 0; i < 2; i++ {
			must(t, m.Lock(ctx))
		}
		if err := m.Unlock(ctx); err != nil { // its reply "times out"
			t.Fatal(err)
		}
		unlock := rec.Last()
		if err := m.Lock(ctx); err != nil { // the owner re-enters meanwhile
			t.Fatal(err)
		}
		replayAsBefore(t, ctx, rdb, unlock, 2, "Unlock")
		assertLevelsAfterRetry(t, b, ctx, name, 2)
		if ok, _ := newClient(t, b).Mutex(name).TryLock(dsync.WithOwner(ctx)); ok {
			t.Fatal("another owner got in while the first still holds a level")
		}
		_ = m.Unlock(ctx)
		_ = m.Unlock(ctx)
	})
}

func TestMutexLockRetriedLateChangesNothing(t *testing.T) {
	eachRecordedMutex(t, true, func(t *testing.T, b redistest.Backend, ctx context.Context, name string, m *dsync.Mutex, rdb redis.UniversalClient, rec *redistest.Recorder) {
		must(t, m.Lock(ctx))
		if err := m.Lock(ctx); err != nil { // a re-entry whose reply "times out"
			t.Fatal(err)
		}
		lock := rec.Last()
		must(t, m.Unlock(ctx))
		if v, err := rdb.Do(ctx, lock...).Int64Slice(); err != nil || len(v) != 2 || (v[0] != 1 && v[0] != 2) || v[1] <= 0 {
			t.Fatalf("replayed Lock = %v, %v; want the fencing token (as before)", v, err)
		}
		assertLevelsAfterRetry(t, b, ctx, name, 1)
		must(t, m.Unlock(ctx))
		if ok, _ := newClient(t, b).Mutex(name).TryLock(context.Background()); !ok {
			t.Fatal("lock leaked by the late retry")
		}
	})
}

func TestMutexReleaseRetriedLateAnswersAsBefore(t *testing.T) {
	eachRecordedMutex(t, false, func(t *testing.T, b redistest.Backend, ctx context.Context, name string, m *dsync.Mutex, rdb redis.UniversalClient, rec *redistest.Recorder) {
		must(t, m.Lock(ctx))
		must(t, m.Unlock(ctx))
		unlock := rec.Last()
		// Other holders come and go before the retry arrives.
		other := newClient(t, b).Mutex(name)
		for i := 0; i < 3; i++ {
			must(t, other.Lock(ctx))
			must(t, other.Unlock(ctx))
		}
		must(t, other.Lock(ctx))
		replayAsBefore(t, ctx, rdb, unlock, 1, "releasing Unlock")
		if ok, _ := newClient(t, b).Mutex(name).TryLock(context.Background()); ok {
			t.Fatal("the late retry released another holder's lock")
		}
		_ = other.Unlock(ctx)
	})
}

func TestMutexUnlockOfNothingRetriedLateEndsNothing(t *testing.T) {
	eachRecordedMutex(t, true, func(t *testing.T, b redistest.Backend, ctx context.Context, name string, m *dsync.Mutex, rdb redis.UniversalClient, rec *redistest.Recorder) {
		// An Unlock with nothing held names no hold.
		mustIs(t, m.Unlock(ctx), dsync.ErrNotHeld, "Unlock of nothing = %v, want ErrNotHeld")
		unlock := rec.Last()
		must(t, m.Lock(ctx))
		replayAsBefore(t, ctx, rdb, unlock, 0, "Unlock")
		assertLevelsAfterRetry(t, b, ctx, name, 1)
		if err := m.Unlock(ctx); err != nil {
			t.Fatalf("Unlock = %v, want nil", err)
		}
	})
}

// noscriptHook makes every EVALSHA find no script (it names an unknown
// one) and fails every SCRIPT LOAD as if the caller's ctx had ended then.
type noscriptHook struct{}

func (noscriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (noscriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		switch {
		case cmd.Name() == "evalsha":
			args[1] = "0000000000000000000000000000000000000000"
		case cmd.Name() == "script" && len(args) > 1 && args[1] == "load":
			cmd.SetErr(context.Canceled)
			return context.Canceled
		}
		return next(ctx, cmd)
	}
}

func (noscriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A call whose script the server does not know, and whose loading of it
// fails (its ctx ended, say), returns the loading's error, not the
// NOSCRIPT that asked for it: the caller sees ctx's error as documented.
func TestScriptLoadFailureIsReported(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		rdb := b.NewClient(t)
		rdb.AddHook(noscriptHook{})
		c := dsync.New(rdb)
		t.Cleanup(func() { c.Close() })
		err := c.Mutex(redistest.Key(t)).Lock(ctxT(t))
		if !errors.Is(err, context.Canceled) || redis.HasErrorPrefix(err, "NOSCRIPT") {
			t.Fatalf("Lock = %v, want the loading's context.Canceled", err)
		}
	})
}

// writeReleaseKinds are the write holds, with their unlock script.
var writeReleaseKinds = []struct {
	name, script string
	kind         holdKind
}{
	{"Mutex", "mutex_unlock", mutexHold},
	{"RWMutex", "rwmutex_unlock", writeHold},
}

// eachWriteRelease runs f for each kind of write hold, by handle and by
// owner, on each backend: h holds name through a Client whose unlock
// script f can fault (the script loaded first, so that a lost reply is of
// a run of it), and l is its Lease.
func eachWriteRelease(t *testing.T, f func(t *testing.T, b redistest.Backend, ctx context.Context, name string, kind holdKind, h holdCalls, faults *redistest.Faults, l *dsync.Lease)) {
	for _, k := range writeReleaseKinds {
		for _, owned := range []bool{false, true} {
			t.Run(k.name+"/"+map[bool]string{false: "handle", true: "owner"}[owned], func(t *testing.T) {
				eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
					if owned {
						ctx = dsync.WithOwner(ctx)
					}
					faults := scriptFaults(k.script)
					c, _ := hookedClient(t, b, faults)
					h := k.kind(c, name)
					must(t, h.lock(ctx))
					must(t, h.unlock(ctx))
					f(t, b, ctx, name, k.kind, h, faults, lockLeaseOf(t, ctx, h, "take"))
				})
			})
		}
	}
}

// An Unlock whose reply was lost, called again after other holders took
// and released the name, reports the hold released: its repeat answers as
// its first run did, however many calls came in between. Mutex and
// RWMutex write holds, by handle and by owner.
func TestUnlockRetriedAfterOthersCameAndWent(t *testing.T) {
	eachWriteRelease(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string, kind holdKind, h holdCalls, f *redistest.Faults, l *dsync.Lease) {
		f.DropReplyNext(1, errors.New("i/o timeout"))
		if err := h.unlock(ctx); err == nil {
			t.Fatal("Unlock with its reply lost returned nil")
		}
		other := kind(newClient(t, b), name)
		for range 3 {
			must(t, other.lock(ctx))
			must(t, other.unlock(ctx))
		}
		if err := h.unlock(ctx); err != nil {
			t.Fatalf("Unlock again: %v, want nil (the first copy released the hold)", err)
		}
		if err := l.Err(); err != nil {
			t.Fatalf("Lease.Err = %v, want nil", err)
		}
		mustIs(t, h.unlock(ctx), dsync.ErrNotHeld, "a third Unlock = %v, want ErrNotHeld")
	})
}

// A release that finds its hold gone is a loss: the hold's keys deleted
// under a live lease, Unlock returns ErrLeaseLost. And a copy run twice at
// once (go-redis sent it again) answers released both times.
func TestReleaseFindsItsHoldGoneOrRepeated(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		m := c.Mutex(name)
		l := lockLease(t, ctx, m)
		must(t, b.NewClient(t).Del(ctx, mutexKeys(name).Lock).Err())
		mustIs(t, m.Unlock(ctx), dsync.ErrLeaseLost, "Unlock of a deleted hold = %v, want ErrLeaseLost")
		mustIs(t, l.Err(), dsync.ErrLeaseLost, "Lease.Err = %v, want ErrLeaseLost")
	})
	eachRecordedMutex(t, false, func(t *testing.T, b redistest.Backend, ctx context.Context, name string, m *dsync.Mutex, rdb redis.UniversalClient, rec *redistest.Recorder) {
		must(t, m.Lock(ctx))
		must(t, m.Unlock(ctx))
		replayAsBefore(t, ctx, rdb, rec.Last(), 1, "releasing Unlock")
		replayAsBefore(t, ctx, rdb, rec.Last(), 1, "releasing Unlock")
	})
}

// The fence key replaced by a string while the holder holds (foreign
// data): its Unlock still releases, and says so; the name is free, and
// the foreign key untouched.
func TestReleaseWithAForeignFenceKey(t *testing.T) {
	kinds := []struct {
		name  string
		kind  holdKind
		fence func(string) string
	}{
		{"Mutex", mutexHold, func(n string) string { return mutexKeys(n).Fence }},
		{"RWMutex", writeHold, func(n string) string { return rwk(n).Fence }},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				h := k.kind(newClient(t, b), name)
				must(t, h.lock(ctx))
				rdb := b.NewClient(t)
				must(t, rdb.Set(ctx, k.fence(name), "foreign", time.Minute).Err())
				if err := h.unlock(ctx); err != nil {
					t.Fatalf("Unlock with the fence key a string: %v, want nil", err)
				}
				n, err := rdb.Exists(ctx, mutexKeys(name).Lock, rwk(name).Writer).Result()
				must(t, err)
				if n != 0 {
					t.Fatal("the hold is still there after its Unlock returned nil")
				}
				if v, err := rdb.Get(ctx, k.fence(name)).Result(); err != nil || v != "foreign" {
					t.Fatalf("fence key after the Unlock: %q, %v; want the foreign string untouched", v, err)
				}
			})
		})
	}
}

// resentUnlock plays go-redis sending an unlock again after a read
// timeout: the first copy runs, then other holders take and release the
// name, and the second copy's reply is the caller's.
type resentUnlock struct {
	sha    string
	armed  atomic.Bool
	others func()
}

func (r *resentUnlock) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *resentUnlock) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !runsScript(cmd, r.sha) || !r.armed.Load() {
			return next(ctx, cmd)
		}
		if err := next(ctx, cmd); err != nil || !r.armed.CompareAndSwap(true, false) {
			return err // a NOSCRIPT: its EVAL comes next
		}
		r.others()
		time.Sleep(20 * time.Millisecond)
		return next(ctx, cmd)
	}
}

func (r *resentUnlock) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// An Unlock that go-redis sent twice, the second copy coming after the
// first released the hold and other holders came and went, returns nil:
// the second answers as the first did. Mutex and RWMutex write holds.
func TestUnlockResentByGoRedisAfterOthersCameAndWent(t *testing.T) {
	for _, k := range writeReleaseKinds {
		t.Run(k.name, func(t *testing.T) {
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				other := k.kind(newClient(t, b), name)
				hook := &resentUnlock{sha: lua.Script(k.script).Hash(), others: func() {
					for range 2 {
						must(t, other.lock(ctx))
						must(t, other.unlock(ctx))
					}
				}}
				c, _ := hookedClient(t, b, hook)
				h := k.kind(c, name)
				l := lockLeaseOf(t, ctx, h, "take")
				hook.armed.Store(true)
				if err := h.unlock(ctx); err != nil {
					t.Fatalf("Unlock sent twice: %v, want nil", err)
				}
				if hook.armed.Load() {
					t.Fatal("the Unlock was not sent twice")
				}
				if err := l.Err(); err != nil {
					t.Fatalf("Lease.Err = %v, want nil", err)
				}
			})
		})
	}
}

// A hold deleted under its holder (data loss, a failover), and the reply
// of its Unlock lost: the Unlock sent again still reports the loss, as
// the first copy found it (a repeat answers as the first run did), not a
// release. Mutex and RWMutex write holds, by handle and by owner.
func TestUnlockRetriedAfterItsHoldWasDeletedReportsTheLoss(t *testing.T) {
	eachWriteRelease(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string, kind holdKind, h holdCalls, f *redistest.Faults, l *dsync.Lease) {
		must(t, b.NewClient(t).Del(ctx, mutexKeys(name).Lock, rwk(name).Writer).Err())
		// Others take and release the name meanwhile.
		other := kind(newClient(t, b), name)
		for range 2 {
			must(t, other.lock(ctx))
			must(t, other.unlock(ctx))
		}
		f.DropReplyNext(1, errors.New("i/o timeout"))
		if err := h.unlock(ctx); err == nil {
			t.Fatal("Unlock with its reply lost returned nil")
		}
		mustIs(t, h.unlock(ctx), dsync.ErrLeaseLost, "Unlock again = %v, want ErrLeaseLost (the hold was deleted before it)")
		mustIs(t, l.Err(), dsync.ErrLeaseLost, "Lease.Err = %v, want ErrLeaseLost")
	})
}
