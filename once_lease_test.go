package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// onceRunKey is the run hash of the Once called name.
func onceRunKey(name string) string { return "dsync:{" + name + "}:once" }

// waitWaitedFor waits, while ctx lasts, until a waiter marked the run hash
// of the Once name as waited for.
func waitWaitedFor(t *testing.T, ctx context.Context, rdb redis.UniversalClient, name string) {
	t.Helper()
	dl, _ := ctx.Deadline()
	waitFor(t, time.Until(dl), "the waiter to wait", func() bool {
		ok, _ := rdb.HExists(ctx, onceRunKey(name), "w").Result()
		return ok
	})
}

// A call that waited longer than the TTL for a run that then failed runs f
// with a fresh lease: the lease is measured from the attempt that was
// granted the run, not from the call's first attempt.
func TestOnceTakeoverAfterALongWaitHasALiveLease(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const ttl = time.Second
		rdb := b.NewClient(t)
		errBoom := errors.New("boom")

		started, fail := make(chan struct{}), make(chan struct{})
		runner := make(chan error, 1)
		go func() {
			runner <- newClient(t, b, dsync.TTL(ttl)).Once(name).Do(ctx, func(fctx context.Context) error {
				close(started)
				select {
				case <-fail:
					return errBoom
				case <-fctx.Done():
					return context.Cause(fctx)
				}
			})
		}()
		<-started
		runnerTok, err := rdb.HGet(ctx, onceRunKey(name), "t").Result()
		if err != nil {
			t.Fatalf("runner's run lease: %v", err)
		}

		var (
			ranAfter   time.Duration // from the waiter's first refused attempt
			cause      error         // of f's ctx, if it was cancelled
			owner      string        // the run hash's runner while the waiter's f ran
			pttl       time.Duration
			firstAfter time.Time
		)
		waiter := make(chan error, 1)
		go func() {
			waiter <- newClient(t, b, dsync.TTL(ttl)).Once(name).Do(ctx, func(fctx context.Context) error {
				ranAfter = time.Since(firstAfter)
				select {
				case <-fctx.Done():
					cause = context.Cause(fctx)
					return fctx.Err()
				case <-time.After(300 * time.Millisecond):
				}
				owner, _ = rdb.HGet(ctx, onceRunKey(name), "t").Result()
				pttl, _ = rdb.PTTL(ctx, onceRunKey(name)).Result()
				if err := fctx.Err(); err != nil {
					cause = context.Cause(fctx)
					return err
				}
				return nil
			})
		}()
		// The waiter's first attempt was refused once it marked the run
		// hash as waited for.
		waitWaitedFor(t, ctx, rdb, name)
		firstAfter = time.Now()
		time.Sleep(ttl + ttl/2) // the runner's lease is renewed meanwhile
		close(fail)

		if err := <-runner; !errors.Is(err, errBoom) || errors.Is(err, dsync.ErrLeaseLost) {
			t.Fatalf("runner's Do = %v, want boom without ErrLeaseLost", err)
		}
		err = <-waiter
		if ranAfter < ttl {
			t.Errorf("the waiter ran f %v after its first attempt, want more than the TTL %v", ranAfter, ttl)
		}
		if cause != nil {
			t.Errorf("f's ctx was cancelled within 300ms of the takeover (cause %v), want it alive with a fresh %v lease", cause, ttl)
		}
		if err != nil {
			t.Errorf("waiter's Do = %v, want nil", err)
		}
		if owner == "" || owner == runnerTok || pttl <= 0 {
			t.Errorf("while the waiter ran f: run hash runner %q (first runner %q), PTTL %v; want the waiter's live run lease", owner, runnerTok, pttl)
		}
	})
}

// onceDoCalls returns the once_do calls among the scripts rec recorded,
// oldest first.
func onceDoCalls(t *testing.T, rec *redistest.Recorder) [][]any {
	t.Helper()
	src, err := dsync.ScriptSource("once_do")
	if err != nil {
		t.Fatal(err)
	}
	sha := redis.NewScript(src).Hash()
	var calls [][]any
	for _, args := range rec.All() {
		if len(args) > 1 && args[0] == "evalsha" && args[1] == sha {
			calls = append(calls, args)
		}
	}
	if len(calls) == 0 {
		t.Fatal("no once_do call recorded")
	}
	return calls
}

// A copy of a Once attempt that reaches Redis late (a go-redis retry whose
// first copy was delayed), after its call ended, takes no run lease that
// nobody would renew or end: neither a copy of the attempt that was granted
// the run, once the run failed, succeeded, or succeeded and was reset, nor a
// copy of a waiter's refused attempt after the Once was done and reset.
func TestOnceLateCopyOfAnAttemptTakesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		// logged returns a Once on a Client whose scripts are recorded.
		logged := func(t *testing.T, name string) (*dsync.Once, *redistest.Recorder) {
			c, _, rec := recorded(t, b)
			return c.Once(name), rec
		}
		// replayLeavesNoRun sends cmd again, raw, and checks that no run
		// lease appears.
		replayLeavesNoRun := func(t *testing.T, name string, cmd []any) {
			t.Helper()
			ctx := ctxT(t)
			rdb := b.NewClient(t)
			if err := rdb.Do(ctx, cmd...).Err(); err != nil && !errors.Is(err, redis.Nil) {
				t.Fatalf("late copy: %v", err)
			}
			if n, err := rdb.Exists(ctx, onceRunKey(name)).Result(); err != nil || n != 0 {
				t.Errorf("after the late copy: run hash exists = %d, %v; want 0", n, err)
			}
		}
		// nextCallRuns checks that the next call runs f at once: a run
		// lease left by a late copy would make it wait for its 30 s TTL.
		nextCallRuns := func(t *testing.T, name string) {
			t.Helper()
			qctx, cancel := context.WithTimeout(ctxT(t), 5*time.Second)
			defer cancel()
			assertDoRuns(t, qctx, newClient(t, b).Once(name), "next Do")
		}
		// run runs f through a logged Once and returns the once_do call
		// that granted the run and Do's error.
		run := func(t *testing.T, name string, ok bool) ([]any, error) {
			o, rec := logged(t, name)
			var granted []any
			err := o.Do(ctxT(t), func(context.Context) error {
				calls := onceDoCalls(t, rec)
				granted = calls[len(calls)-1]
				if !ok {
					return errors.New("failed")
				}
				return nil
			})
			return granted, err
		}

		t.Run("failed", func(t *testing.T) {
			name := redistest.Key(t)
			granted, err := run(t, name, false)
			if err == nil {
				t.Fatal("Do = nil, want f's error")
			}
			replayLeavesNoRun(t, name, granted)
			nextCallRuns(t, name)
			// The ids of recent calls are kept for the replay window only.
			k := onceRunKey(name) + ":x"
			if d, err := b.NewClient(t).PTTL(ctxT(t), k).Result(); err != nil || d <= 0 || d > time.Minute {
				t.Errorf("PTTL of the call ids %s = %v, %v; want within a minute", k, d, err)
			}
		})
		t.Run("done", func(t *testing.T) {
			name := redistest.Key(t)
			granted, err := run(t, name, true)
			if err != nil {
				t.Fatal(err)
			}
			replayLeavesNoRun(t, name, granted)
			if done, err := newClient(t, b).Once(name).Done(ctxT(t)); !done || err != nil {
				t.Errorf("Done = %v, %v; want true", done, err)
			}
		})
		t.Run("done_then_reset", func(t *testing.T) {
			name := redistest.Key(t)
			granted, err := run(t, name, true)
			if err != nil {
				t.Fatal(err)
			}
			must(t, newClient(t, b).Once(name).Reset(ctxT(t)))
			replayLeavesNoRun(t, name, granted)
			nextCallRuns(t, name)
		})
		t.Run("waiter_after_reset", func(t *testing.T) {
			name := redistest.Key(t)
			ctx := ctxT(t)
			rdb := b.NewClient(t)
			started, finish := make(chan struct{}), make(chan struct{})
			runner := make(chan error, 1)
			go func() {
				runner <- newClient(t, b).Once(name).Do(ctx, func(context.Context) error {
					close(started)
					<-finish
					return nil
				})
			}()
			<-started
			o, rec := logged(t, name)
			waiter := make(chan error, 1)
			go func() {
				waiter <- o.Do(ctx, func(context.Context) error {
					t.Error("the waiter ran f")
					return nil
				})
			}()
			waitWaitedFor(t, ctx, rdb, name)
			close(finish)
			if err := <-runner; err != nil {
				t.Fatal(err)
			}
			if err := <-waiter; err != nil {
				t.Fatalf("waiter's Do = %v, want nil", err)
			}
			must(t, o.Reset(ctx))
			// The waiter's first attempt was refused.
			replayLeavesNoRun(t, name, onceDoCalls(t, rec)[0])
			nextCallRuns(t, name)
		})
	})
}
