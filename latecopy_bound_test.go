package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
	"github.com/redis/go-redis/v9"
)

// A copy of an acquiring attempt that reaches the server after the replay
// window, when the call's id is forgotten, must not act as a new call: it
// would take a hold that nobody renews or releases. Each attempt carries a
// bound after which it takes nothing (clock.go).

// boundKind is one acquiring call: its script, its call through a handle
// of c, the release, and the call ids zset of the name.
type boundKind struct {
	name, script string
	calls        func(c *dsync.Client, name string) (take, release func(context.Context) error)
	idKey        func(name string) string
	// free takes and releases the name through another Client at once,
	// and reports whether it could.
	free func(ctx context.Context, c *dsync.Client, name string) (bool, error)
}

func boundKinds() []boundKind {
	// tryFree tries once and releases what it took.
	tryFree := func(ctx context.Context, try func(context.Context) (bool, error), release func(context.Context) error) (bool, error) {
		ok, err := try(ctx)
		if ok {
			err = release(ctx)
		}
		return ok, err
	}
	mutexFree := func(ctx context.Context, c *dsync.Client, n string) (bool, error) {
		m := c.Mutex(n)
		return tryFree(ctx, m.TryLock, m.Unlock)
	}
	rwFree := func(ctx context.Context, c *dsync.Client, n string) (bool, error) {
		rw := c.RWMutex(n)
		return tryFree(ctx, rw.TryLock, rw.Unlock)
	}
	sem := func(c *dsync.Client, n string) (take, release func(context.Context) error) {
		s := c.Semaphore(n, 1)
		return func(ctx context.Context) error { return s.Acquire(ctx, 1) },
			func(ctx context.Context) error { return s.Release(ctx, 1) }
	}
	return []boundKind{
		{"Mutex", "mutex_lock", func(c *dsync.Client, n string) (func(context.Context) error, func(context.Context) error) {
			m := c.Mutex(n)
			return m.Lock, m.Unlock
		}, func(n string) string { return mutexKeys(n).Calls }, mutexFree},
		{"RWMutex write", "rwmutex_lock", func(c *dsync.Client, n string) (func(context.Context) error, func(context.Context) error) {
			rw := c.RWMutex(n)
			return rw.Lock, rw.Unlock
		}, func(n string) string { return rwk(n).Calls }, rwFree},
		{"RWMutex read", "rwmutex_lock", func(c *dsync.Client, n string) (func(context.Context) error, func(context.Context) error) {
			rw := c.RWMutex(n)
			return rw.RLock, rw.RUnlock
		}, func(n string) string { return rwk(n).Calls }, rwFree},
		{"Semaphore", "semaphore_acquire", sem, func(n string) string { return semKeys(n).Calls },
			func(ctx context.Context, c *dsync.Client, n string) (bool, error) {
				s := c.Semaphore(n, 1)
				return tryFree(ctx, func(ctx context.Context) (bool, error) { return s.TryAcquire(ctx, 1) },
					func(ctx context.Context) error { return s.Release(ctx, 1) })
			}},
	}
}

// lateValid is the bound the tests that deliver a copy past it give their
// Client's attempts: long enough that an attempt of the call itself, on a
// loaded machine, is not past it.
const lateValid = time.Second

// waitPastBound waits until the server's time is past the bound of the
// recorded attempt args.
func waitPastBound(t *testing.T, ctx context.Context, rdb redis.UniversalClient, args []any) {
	t.Helper()
	bound, err := strconv.ParseInt(fmt.Sprint(args[len(args)-1]), 10, 64)
	must(t, err)
	waitFor(t, 10*time.Second, "the server's time past the attempt's bound", func() bool {
		now, err := rdb.Time(ctx).Result()
		return err == nil && now.UnixMilli() > bound
	})
}

// recordAttempt runs take with a recorder on c's connection and returns the
// arguments of the last attempt of script it sent.
func recordAttempt(t *testing.T, rec *redistest.Recorder, script string, take func() error) []any {
	t.Helper()
	rec.Reset()
	must(t, take())
	return lastRun(t, rec, script, "")
}

// A copy of an attempt that took a hold, delivered after its bound and
// after the call's id was forgotten (the ids zset deleted, as the replay
// window does), takes nothing: the reply says stale and the name stays
// free. The same copy with a bound that has not passed would take a hold
// (the control: what the bound prevents).
func TestLateAttemptCopyAfterItsBoundTakesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, k := range boundKinds() {
			ctx, rdb, other, name, args := k.recordedTake(t, b, func(c *dsync.Client) { dsync.SetAttemptValid(c, lateValid) })
			// Past the bound and the ids forgotten.
			waitPastBound(t, ctx, rdb, args)
			must(t, rdb.Del(ctx, k.idKey(name)).Err())
			k.staleCopyTakesNothing(t, ctx, rdb, other, name, args)
			// Control: the same copy with a bound not yet passed is a new
			// call once its id is forgotten, and takes the name.
			must(t, rdb.Del(ctx, k.idKey(name)).Err())
			fresh := append([]any(nil), args...)
			fresh[len(fresh)-1] = boundNow(t, ctx, rdb, 5*time.Second)
			v, err := rdb.Do(ctx, fresh...).Result()
			must(t, err)
			if got := code(v); got != 1 {
				t.Fatalf("%s: control copy with a live bound replied %v, want {1, token}", k.name, v)
			}
		}
	})
}

// recordedTake takes a name of k's through a Client made on b with opts
// (and set up by setup, if not nil) whose commands a recorder sees, and
// releases it. It returns the test's ctx, the Client's connection,
// another Client, the name and the arguments of the take's last attempt.
func (k boundKind) recordedTake(t *testing.T, b redistest.Backend, setup func(*dsync.Client), opts ...dsync.Option) (context.Context, redis.UniversalClient, *dsync.Client, string, []any) {
	t.Helper()
	rec := &redistest.Recorder{}
	c, rdb := hookedClient(t, b, rec, opts...)
	if setup != nil {
		setup(c)
	}
	name := redistest.Key(t) + "-" + strings.ReplaceAll(k.name, " ", "-")
	ctx := ctxT(t)
	take, release := k.calls(c, name)
	args := recordAttempt(t, rec, k.script, func() error { return take(ctx) })
	must(t, release(ctx))
	return ctx, rdb, newClient(t, b), name, args
}

// staleCopyTakesNothing sends args, a copy of an attempt of k on name past
// its bound, and checks that it is answered stale and that other can
// then take the name at once.
func (k boundKind) staleCopyTakesNothing(t *testing.T, ctx context.Context, rdb redis.UniversalClient, other *dsync.Client, name string, args []any) {
	t.Helper()
	v, err := rdb.Do(ctx, args...).Result()
	must(t, err)
	if got := code(v); got != 6 {
		t.Fatalf("%s: copy after its bound replied %v, want {6, server time}", k.name, v)
	}
	if ok, err := k.free(ctx, other, name); err != nil || !ok {
		t.Fatalf("%s: another Client's try after the late copy = %v, %v: the copy took a hold nobody releases", k.name, ok, err)
	}
}

// boundNow returns a bound d after the server's time now.
func boundNow(t *testing.T, ctx context.Context, rdb redis.UniversalClient, d time.Duration) string {
	t.Helper()
	now, err := rdb.Time(ctx).Result()
	must(t, err)
	return strconv.FormatInt(now.Add(d).UnixMilli(), 10)
}

// On miniredis, whose clock a test moves: a copy delivered a minute and a
// second after its call (the replay window passed, the ids expired with
// their key), with the default bound, takes nothing.
func TestLateAttemptCopyAMinuteLater(t *testing.T) {
	b := redistest.Miniredis(t)
	for _, k := range boundKinds() {
		ctx, rdb, other, name, args := k.recordedTake(t, b, nil, dsync.TTL(10*time.Minute))
		b.Advance(61 * time.Second)
		if n, err := rdb.Exists(ctx, k.idKey(name)).Result(); err != nil || n != 0 {
			t.Fatalf("%s: the call ids outlived the replay window: %v, %v", k.name, n, err)
		}
		k.staleCopyTakesNothing(t, ctx, rdb, other, name, args)
	}
}

// A Client whose clock is off the server's by ten minutes, either way,
// still takes and releases: its first attempt comes back stale, it learns
// the server's time from the reply and sends the attempt again (same call,
// one more round trip), and later attempts go through at once.
func TestAttemptsOfAClientWithItsClockOff(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, off := range []time.Duration{10 * time.Minute, -10 * time.Minute} {
			for _, k := range boundKinds() {
				rec := &redistest.Recorder{}
				c, rdb := hookedClient(t, b, rec)
				dsync.SetClockOffset(c, off)
				name := redistest.Key(t) + "-" + strings.ReplaceAll(k.name, " ", "-")
				ctx := ctxT(t)
				// Loaded first: a NOSCRIPT reply would count as an attempt.
				must(t, lua.Script(k.script).Load(ctx, rdb).Err())
				take, release := k.calls(c, name)
				for i, want := range []int{2, 1} {
					rec.Reset()
					must(t, take(ctx))
					if n := countScript(rec, k.script); n != want {
						t.Fatalf("%s, clock off %v, call %d: %d attempts, want %d", k.name, off, i+1, n, want)
					}
					must(t, release(ctx))
				}
				if ok, err := k.free(ctx, newClient(t, b), name); err != nil || !ok {
					t.Fatalf("%s, clock off %v: name not free after the releases: %v, %v", k.name, off, ok, err)
				}
			}
			// Once.Do: its first attempt comes back stale and is sent
			// again; a Do that then finds the Once done reads no clock.
			rec := &redistest.Recorder{}
			c, rdb := hookedClient(t, b, rec)
			dsync.SetClockOffset(c, off)
			ctx := ctxT(t)
			must(t, lua.Script("once_do").Load(ctx, rdb).Err())
			o := c.Once(redistest.Key(t))
			for i, want := range []int{2, 1} {
				rec.Reset()
				runs := 0
				must(t, o.Do(ctx, func(context.Context) error { runs++; return nil }))
				if n := countScript(rec, "once_do"); n != want || runs != 1-i {
					t.Fatalf("Once, clock off %v, Do %d: %d attempts and %d runs of f, want %d and %d", off, i+1, n, runs, want, 1-i)
				}
			}
		}
	})
}

// countScript counts the runs of script rec saw.
func countScript(rec *redistest.Recorder, script string) int {
	sha := lua.Script(script).Hash()
	n := 0
	for _, a := range rec.All() {
		if len(a) > 1 && a[0] == "evalsha" && a[1] == sha {
			n++
		}
	}
	return n
}

// The same for Once.Do: a copy of the attempt that took the run (whose f
// failed, so the Once is not done), delivered after its bound once the
// call's id is forgotten, takes no run that nobody renews or ends.
func TestLateDoCopyAfterItsBoundTakesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		rec := &redistest.Recorder{}
		c, rdb := hookedClient(t, b, rec)
		dsync.SetAttemptValid(c, lateValid)
		name := redistest.Key(t)
		ctx := ctxT(t)
		failed := errors.New("f failed")
		args := recordAttempt(t, rec, "once_do", func() error {
			if err := c.Once(name).Do(ctx, func(context.Context) error { return failed }); !errors.Is(err, failed) {
				return fmt.Errorf("Do = %v, want f's error", err)
			}
			return nil
		})
		k := onceKeys(name)
		waitPastBound(t, ctx, rdb, args)
		must(t, rdb.Del(ctx, k.Calls).Err())
		v, err := rdb.Do(ctx, args...).Result()
		must(t, err)
		if got := code(v); got != 6 {
			t.Fatalf("copy after its bound replied %v, want {6, server time}", v)
		}
		if n, err := rdb.Exists(ctx, k.Run).Result(); err != nil || n != 0 {
			t.Fatalf("run hash after the late copy: %v, %v; want none", n, err)
		}
		ran := false
		must(t, newClient(t, b).Once(name).Do(ctx, func(context.Context) error { ran = true; return nil }))
		if !ran {
			t.Fatal("another Client's Do did not run f")
		}
		// Control: with a live bound the copy (of a call now forgotten)
		// would take the run, were the Once not done; here it finds it done.
		must(t, rdb.Del(ctx, k.Done, k.Calls).Err())
		fresh := append([]any(nil), args...)
		fresh[len(fresh)-1] = boundNow(t, ctx, rdb, 5*time.Second)
		v, err = rdb.Do(ctx, fresh...).Result()
		must(t, err)
		if got := code(v); got != 1 {
			t.Fatalf("control copy with a live bound replied %v, want {1, 0}", v)
		}
	})
}

// A copy of a Reset delivered after its bound, when its id is forgotten,
// removes nothing: not the done mark of a run that succeeded after the
// Reset took effect.
func TestLateResetCopyAfterItsBoundRemovesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		rec := &redistest.Recorder{}
		c, rdb := hookedClient(t, b, rec)
		dsync.SetAttemptValid(c, lateValid)
		ctx := ctxT(t)
		name := redistest.Key(t)
		o := c.Once(name)
		ok := func(context.Context) error { return nil }
		must(t, o.Do(ctx, ok))
		args := recordAttempt(t, rec, "once_reset", func() error { return o.Reset(ctx) })
		must(t, o.Do(ctx, ok)) // the run after the Reset
		waitPastBound(t, ctx, rdb, args)
		k := onceKeys(name)
		must(t, rdb.Del(ctx, k.Calls).Err())
		v, err := rdb.Do(ctx, args...).Result()
		must(t, err)
		if got := code(v); got != 6 {
			t.Fatalf("Reset copy after its bound replied %v, want {6, server time}", v)
		}
		if done, err := o.Done(ctx); err != nil || !done {
			t.Fatalf("Done after the late Reset copy = %v, %v; want true", done, err)
		}
		// Control: with a live bound the forgotten copy removes the mark.
		fresh := append([]any(nil), args...)
		fresh[len(fresh)-1] = boundNow(t, ctx, rdb, 5*time.Second)
		if v, err := rdb.Do(ctx, fresh...).Result(); err != nil || code(v) != 1 {
			t.Fatalf("control Reset copy with a live bound = %v, %v; want 1", v, err)
		}
	})
}

// A Reset whose attempts got no reply before its ctx ended returns an
// error of unknown outcome; a copy of one of its attempts still on its
// way, delivered within its bound after a later Reset and a run that
// succeeded, must not remove that run's done mark. The given-up Reset's
// id is noted in the background (its abandon), so the copy changes
// nothing.
func TestLateCopyOfAGivenUpResetRemovesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		rec, faults := &redistest.Recorder{}, scriptFaults("once_reset")
		c, rdb := hookedClient(t, b, rec)
		rdb.AddHook(faults)
		ctx := ctxT(t)
		name := redistest.Key(t)
		other := newClient(t, b).Once(name)
		ok := func(context.Context) error { return nil }
		must(t, other.Do(ctx, ok))
		faults.FailNext(1000, context.DeadlineExceeded) // no attempt gets a reply
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := c.Once(name).Reset(rctx)
		cancel()
		if err == nil {
			t.Fatal("a Reset none of whose attempts got a reply returned nil")
		}
		args := lastRun(t, rec, "once_reset", "")
		faults.FailNext(0, nil)
		id := fmt.Sprint(args[6]) // evalsha, sha, 3, three keys, then the id
		calls := keys.ForOnce(dsync.DefaultPrefix, name).Calls
		waitFor(t, 10*time.Second, "the given-up Reset's id noted", func() bool {
			return rdb.ZScore(ctx, calls, id).Err() == nil
		})
		must(t, other.Reset(ctx))
		must(t, other.Do(ctx, ok))
		if err := rdb.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("the late copy: %v", err)
		}
		if done, err := other.Done(ctx); err != nil || !done {
			t.Fatalf("Done after the late copy of the given-up Reset = %v, %v; want true (the later run's mark kept)", done, err)
		}
	})
}

// A copy of a Do's 'done' release delivered past its bound, after a Reset
// and after the release's id was forgotten, does not mark the Once done
// again: the next Do runs f (Reset: "the next call of Do runs f again").
// The release may set the mark of a run whose lease expired with nobody
// taking over, so a late copy of it finds the Once reset and no runner,
// as that case does.
func TestLateCopyOfADoneReleaseAfterAResetMarksNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		rec := &redistest.Recorder{}
		c, rdb := hookedClient(t, b, rec)
		dsync.SetAttemptValid(c, lateValid)
		ctx, name := ctxT(t), redistest.Key(t)
		o := c.Once(name)
		rec.Reset()
		must(t, o.Do(ctx, func(context.Context) error { return nil }))
		done := lastRun(t, rec, "once_release", " by the Do")
		must(t, o.Reset(ctx))
		waitPastBound(t, ctx, rdb, done)
		must(t, rdb.Del(ctx, onceKeys(name).Calls).Err()) // the replay window passed
		if err := rdb.Do(ctx, done...).Err(); err != nil {
			t.Fatalf("the late copy of the 'done' release: %v", err)
		}
		ran := false
		must(t, newClient(t, b).Once(name).Do(ctx, func(context.Context) error { ran = true; return nil }))
		if !ran {
			t.Fatal("after the Reset, Do returned done without running f: a late copy of the earlier run's 'done' marked the Once done again")
		}
	})
}

// The releases that carry a bound (one naming no hold, and the one that
// marks a Once done) take effect also from a Client whose clock is off the
// server's by ten minutes, either way, and that has not learned the
// server's time yet: the first copy comes back stale, and the release is
// sent again with a bound from the time the reply carried.
func TestBoundedReleasesOfAClientWithItsClockOff(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, off := range []time.Duration{10 * time.Minute, -10 * time.Minute} {
			ctx := ctxT(t)
			// A release naming no hold: the owner's hold, taken through
			// another Client, released through this one.
			for _, k := range []struct {
				name, script string
				take         func(ctx context.Context, c *dsync.Client, name string) error
				release      func(ctx context.Context, c *dsync.Client, name string) error
				try          func(ctx context.Context, c *dsync.Client, name string) (bool, error)
			}{
				{"Mutex", "mutex_unlock",
					func(ctx context.Context, c *dsync.Client, n string) error { return c.Mutex(n).Lock(ctx) },
					func(ctx context.Context, c *dsync.Client, n string) error { return c.Mutex(n).Unlock(ctx) },
					func(ctx context.Context, c *dsync.Client, n string) (bool, error) { return c.Mutex(n).TryLock(ctx) }},
				{"RWMutex", "rwmutex_unlock",
					func(ctx context.Context, c *dsync.Client, n string) error { return c.RWMutex(n).Lock(ctx) },
					func(ctx context.Context, c *dsync.Client, n string) error { return c.RWMutex(n).Unlock(ctx) },
					func(ctx context.Context, c *dsync.Client, n string) (bool, error) { return c.RWMutex(n).TryLock(ctx) }},
				{"Semaphore", "semaphore_release",
					func(ctx context.Context, c *dsync.Client, n string) error { return c.Semaphore(n, 1).Acquire(ctx, 1) },
					func(ctx context.Context, c *dsync.Client, n string) error { return c.Semaphore(n, 1).Release(ctx, 1) },
					func(ctx context.Context, c *dsync.Client, n string) (bool, error) {
						return c.Semaphore(n, 1).TryAcquire(ctx, 1)
					}},
			} {
				name := redistest.Key(t) + "-" + k.name
				octx := dsync.WithOwner(ctx)
				must(t, k.take(octx, newClient(t, b), name))
				rec := &redistest.Recorder{}
				c, rdb := hookedClient(t, b, rec)
				dsync.SetClockOffset(c, off)
				must(t, lua.Script(k.script).Load(ctx, rdb).Err()) // a NOSCRIPT reply would count as a copy
				must(t, k.release(octx, c, name))
				if n := countScript(rec, k.script); n != 2 {
					t.Fatalf("%s, clock off %v: the release was sent %d times, want 2 (stale, then again)", k.name, off, n)
				}
				if ok, err := k.try(ctx, newClient(t, b), name); err != nil || !ok {
					t.Fatalf("%s, clock off %v: name not free after the release: %v, %v", k.name, off, ok, err)
				}
			}
			// The 'done' of a Once, when the Client's estimate goes off
			// while f runs.
			rec := &redistest.Recorder{}
			c, rdb := hookedClient(t, b, rec)
			must(t, lua.Script("once_release").Load(ctx, rdb).Err())
			name := redistest.Key(t) + "-Once"
			must(t, c.Once(name).Do(ctx, func(context.Context) error {
				dsync.SetClockOffset(c, off)
				rec.Reset()
				return nil
			}))
			if n := countScript(rec, "once_release"); n != 2 {
				t.Fatalf("Once, clock off %v: the 'done' was sent %d times, want 2 (stale, then again)", off, n)
			}
			ran := false
			must(t, newClient(t, b).Once(name).Do(ctx, func(context.Context) error { ran = true; return nil }))
			if ran {
				t.Fatalf("Once, clock off %v: f ran again: the 'done' did not mark the Once done", off)
			}
		}
	})
}
