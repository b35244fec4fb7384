package dsync_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/internal/redistest"
)

func TestOnceRunsOnceAndWaitersReturnAfterF(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const clients, callers = 4, 12
		cs := make([]*dsync.Client, clients)
		for i := range cs {
			cs[i] = newClient(t, b)
		}
		var runs atomic.Int64
		var finished atomic.Int64 // UnixNano when f returned
		returned := make([]time.Time, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := cs[i%clients].Once(name).Do(ctx, func(ctx context.Context) error {
					runs.Add(1)
					time.Sleep(100 * time.Millisecond)
					finished.Store(time.Now().UnixNano())
					return nil
				})
				returned[i] = time.Now()
				if err != nil {
					t.Errorf("caller %d: Do = %v, want nil", i, err)
				}
			}()
		}
		wg.Wait()
		if got := runs.Load(); got != 1 {
			t.Fatalf("f ran %d times, want 1", got)
		}
		end := time.Unix(0, finished.Load())
		for i, r := range returned {
			if r.Before(end) {
				t.Errorf("caller %d returned %v before f finished", i, end.Sub(r))
			}
		}
		// A later call does not run f either.
		if err := newClient(t, b).Once(name).Do(ctx, func(context.Context) error {
			t.Error("f ran after the Once was done")
			return nil
		}); err != nil {
			t.Errorf("later Do = %v, want nil", err)
		}
		assertOnceRunKeyGone(t, b, name)
	})
}

// assertOnceRunKeyGone checks that no run lease is left and that the done
// mark persists.
func assertOnceRunKeyGone(t *testing.T, b redistest.Backend, name string) {
	t.Helper()
	rdb := b.NewClient(t)
	ctx := context.Background()
	if n, _ := rdb.Exists(ctx, keys.ForOnce(dsync.DefaultPrefix, name).Run).Result(); n != 0 {
		t.Errorf("run lease left after the run")
	}
	if ttl, _ := rdb.PTTL(ctx, keys.ForOnce(dsync.DefaultPrefix, name).Done).Result(); ttl != -1 {
		t.Errorf("done mark PTTL = %v, want -1 (persists)", ttl)
	}
}

func TestOnceValueIsTheSameForAll(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const callers = 12
		cs := []*dsync.Client{newClient(t, b), newClient(t, b), newClient(t, b)}
		var runs atomic.Int64
		got := make([][]byte, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, err := cs[i%len(cs)].Once(name).DoValue(ctx, func(ctx context.Context) ([]byte, error) {
					runs.Add(1)
					time.Sleep(50 * time.Millisecond)
					return fmt.Appendf(nil, "drawn by caller %d", i), nil
				})
				if err != nil {
					t.Errorf("caller %d: DoValue = %v", i, err)
				}
				got[i] = v
			}()
		}
		wg.Wait()
		if n := runs.Load(); n != 1 {
			t.Fatalf("f ran %d times, want 1", n)
		}
		for i, v := range got {
			if len(v) == 0 || !bytes.Equal(v, got[0]) {
				t.Errorf("caller %d got %q, caller 0 got %q", i, v, got[0])
			}
		}
		later, err := newClient(t, b).Once(name).DoValue(ctx, func(context.Context) ([]byte, error) {
			t.Error("f ran after the Once was done")
			return nil, nil
		})
		if err != nil || !bytes.Equal(later, got[0]) {
			t.Errorf("later DoValue = %q, %v; want %q", later, err, got[0])
		}
	})
}

func TestOnceFailureHandsOver(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		errBoom := errors.New("boom")
		var runs, fails atomic.Int64
		f := func(ctx context.Context) error {
			runs.Add(1)
			time.Sleep(30 * time.Millisecond)
			if fails.Add(1) <= 2 {
				return errBoom // the first two runs fail
			}
			return nil
		}
		const callers = 6
		errs := make([]error, callers)
		var wg sync.WaitGroup
		for i := range callers {
			c := newClient(t, b)
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = c.Once(name).Do(ctx, f)
			}()
		}
		wg.Wait()
		var failed, ok int
		for i, err := range errs {
			switch {
			case err == nil:
				ok++
			case errors.Is(err, errBoom):
				failed++
			default:
				t.Errorf("caller %d: Do = %v, want nil or boom", i, err)
			}
		}
		if runs.Load() != 3 || failed != 2 || ok != callers-2 {
			t.Errorf("runs %d, failed %d, ok %d; want 3, 2, %d", runs.Load(), failed, ok, callers-2)
		}
		if done, err := newClient(t, b).Once(name).Done(ctx); !done || err != nil {
			t.Errorf("Done = %v, %v; want true", done, err)
		}
	})
}

// assertDoRuns checks that o.Do runs f and returns nil; what names the call.
func assertDoRuns(t *testing.T, ctx context.Context, o *dsync.Once, what string) {
	t.Helper()
	ran := false
	if err := o.Do(ctx, func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("%s = %v, ran %v; want nil, true", what, err, ran)
	}
}

func TestOnceFailureWithoutWaitersLetsNextCallRun(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		o := newClient(t, b).Once(redistest.Key(t))
		errBoom := errors.New("boom")
		mustIs(t, o.Do(ctx, func(context.Context) error { return errBoom }), errBoom, "Do = %v, want boom")
		assertDoRuns(t, ctx, o, "second Do")
	})
}

func TestOnceKilledRunnerHandsOverAfterTTL(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const ttl = 600 * time.Millisecond
		dying := dsync.New(b.NewClient(t), dsync.TTL(ttl))
		defer dying.Close()
		other := newClient(t, b, dsync.TTL(ttl))

		started := make(chan struct{})
		dyingErr := make(chan error, 1)
		go func() {
			dyingErr <- dying.Once(name).Do(ctx, func(ctx context.Context) error {
				close(started)
				<-ctx.Done() // the process "dies": f is abandoned
				return ctx.Err()
			})
		}()
		<-started

		var closedAt atomic.Int64
		tookOver := make(chan time.Time, 1)
		otherErr := make(chan error, 1)
		go func() {
			otherErr <- other.Once(name).Do(ctx, func(context.Context) error {
				tookOver <- time.Now()
				return nil
			})
		}()
		time.Sleep(100 * time.Millisecond) // let it wait
		closedAt.Store(time.Now().UnixNano())
		dying.Close()
		checkIs(t, <-dyingErr, dsync.ErrClosed, "dying runner's Do = %v, want ErrClosed")
		select {
		case at := <-tookOver:
			t.Fatalf("took over %v after the close, before the lease ran out", at.Sub(time.Unix(0, closedAt.Load())))
		case <-time.After(ttl / 4):
		}
		advanced := time.Now()
		b.Advance(ttl + 50*time.Millisecond) // on miniredis the lease runs out now
		select {
		case at := <-tookOver:
			if b.Mini != nil && at.Before(advanced) {
				t.Errorf("took over before the lease ran out")
			}
			if d := at.Sub(time.Unix(0, closedAt.Load())); d < ttl/2 {
				t.Errorf("took over %v after the close, want about the TTL %v", d, ttl)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no waiter took over after the TTL")
		}
		if err := <-otherErr; err != nil {
			t.Errorf("waiter's Do = %v, want nil", err)
		}
	})
}

// untilCancelled waits up to 10 s for fctx to end and returns its error,
// or an error that says notCancelled.
func untilCancelled(fctx context.Context, notCancelled string) error {
	select {
	case <-fctx.Done():
		return fctx.Err()
	case <-time.After(10 * time.Second):
		return errors.New(notCancelled)
	}
}

func TestOnceLeaseLossCancelsF(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		c := newClient(t, b, dsync.TTL(300*time.Millisecond))
		var cause error
		err := c.Once(name).Do(ctx, func(fctx context.Context) error {
			// Delete the run lease behind the runner's back.
			if err := rdb.Del(ctx, keys.ForOnce(dsync.DefaultPrefix, name).Run).Err(); err != nil {
				t.Error(err)
			}
			err := untilCancelled(fctx, "f's ctx not cancelled after the lease was lost")
			cause = context.Cause(fctx)
			return err
		})
		if !errors.Is(cause, dsync.ErrLeaseLost) {
			t.Errorf("cause of f's ctx = %v, want ErrLeaseLost", cause)
		}
		if !errors.Is(err, dsync.ErrLeaseLost) || !errors.Is(err, context.Canceled) {
			t.Errorf("Do = %v, want ErrLeaseLost and context.Canceled", err)
		}
		if done, _ := c.Once(name).Done(ctx); done {
			t.Error("Once done after a failed run")
		}
	})
}

func TestOnceCallerCtxCancelsF(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		name := redistest.Key(t)
		c := newClient(t, b)
		ctx, cancel := context.WithCancel(ctxT(t))
		err := c.Once(name).Do(ctx, func(fctx context.Context) error {
			cancel()
			return untilCancelled(fctx, "f's ctx not cancelled")
		})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Do = %v, want context.Canceled", err)
		}
		// The run lease was released: the next call runs at once.
		assertDoRuns(t, ctxT(t), c.Once(name), "next Do")
	})
}

func TestOncePanicReleasesTheRun(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		func() {
			defer func() {
				if p := recover(); p != "oops" {
					t.Errorf("recovered %v, want the panic of f", p)
				}
			}()
			_ = c.Once(name).Do(ctx, func(context.Context) error { panic("oops") })
		}()
		assertDoRuns(t, ctx, newClient(t, b).Once(name), "Do after a panic")
	})
}

func TestOnceDoneAndReset(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		o := newClient(t, b).Once(redistest.Key(t))
		if done, err := o.Done(ctx); done || err != nil {
			t.Fatalf("Done before Do = %v, %v; want false", done, err)
		}
		var runs int
		f := func(context.Context) ([]byte, error) {
			runs++
			return fmt.Appendf(nil, "run %d", runs), nil
		}
		if v, err := o.DoValue(ctx, f); err != nil || string(v) != "run 1" {
			t.Fatalf("DoValue = %q, %v", v, err)
		}
		if done, err := o.Done(ctx); !done || err != nil {
			t.Fatalf("Done after Do = %v, %v; want true", done, err)
		}
		must(t, o.Reset(ctx))
		if done, _ := o.Done(ctx); done {
			t.Fatal("Done after Reset = true")
		}
		if v, err := o.DoValue(ctx, f); err != nil || string(v) != "run 2" {
			t.Fatalf("DoValue after Reset = %q, %v; want run 2", v, err)
		}
		must(t, o.Reset(ctx))
		if err := o.Reset(ctx); err != nil {
			t.Fatalf("Reset of a Once not done = %v", err)
		}
	})
}

func TestOncePeriod(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		const period = 500 * time.Millisecond
		o := newClient(t, b).Once(redistest.Key(t), dsync.Period(period))
		runs := 0
		f := func(context.Context) error { runs++; return nil }
		for range 3 {
			must(t, o.Do(ctx, f))
		}
		if runs != 1 {
			t.Fatalf("runs within one period = %d, want 1", runs)
		}
		b.Advance(period + 100*time.Millisecond)
		if done, _ := o.Done(ctx); done {
			t.Fatal("still done after the period")
		}
		if err := o.Do(ctx, f); err != nil || runs != 2 {
			t.Fatalf("Do after the period = %v, runs %d; want nil, 2", err, runs)
		}
	})
}

func TestOnceDoneCheckIsOneRoundTrip(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		must(t, newClient(t, b).Once(name).Do(ctx, func(context.Context) error { return nil }))
		counter := &redistest.Counter{}
		c, _ := hookedClient(t, b, counter)
		must(t, c.Once(name).Do(ctx, func(context.Context) error {
			t.Error("f ran")
			return nil
		}))
		if n := counter.RoundTrips(); n != 1 {
			t.Errorf("Do of a done Once took %d round trips, want 1", n)
		}
	})
}

func TestOnceLostReplyOfTheDoneMark(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		faults := &redistest.Faults{}
		c, _ := hookedClient(t, b, faults)
		// The reply of the script that sets the done mark is lost (on a
		// fresh server, possibly only its NOSCRIPT answer): the release is
		// made again, and the caller learns the outcome.
		v, err := c.Once(name).DoValue(ctx, func(context.Context) ([]byte, error) {
			faults.DropReplyNext(1, context.DeadlineExceeded)
			return []byte("v"), nil
		})
		if err != nil || string(v) != "v" {
			t.Fatalf("DoValue = %q, %v; want v", v, err)
		}
		v, err = newClient(t, b).Once(name).DoValue(ctx, func(context.Context) ([]byte, error) {
			t.Error("f ran again after its done mark was set")
			return nil, nil
		})
		if err != nil || string(v) != "v" {
			t.Fatalf("next DoValue = %q, %v; want v", v, err)
		}
	})
}

// Done agrees with Do on a done mark that dsync did not write: a key of
// another type is an error matching ErrCorrupt for both, a hash without a
// value is no mark for both (Do runs f and marks the Once done), and the
// name works again once the foreign key is removed.
func TestOnceDoneOnForeignData(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		o := newClient(t, b).Once(name)
		done := keys.ForOnce(dsync.DefaultPrefix, name).Done
		must(t, rdb.Set(ctx, done, "x", time.Minute).Err())
		if d, err := o.Done(ctx); !errors.Is(err, dsync.ErrCorrupt) {
			t.Errorf("Done on a done mark of another type: %v, %v; want ErrCorrupt", d, err)
		}
		ran := false
		if err := o.Do(ctx, func(context.Context) error { ran = true; return nil }); !errors.Is(err, dsync.ErrCorrupt) || ran {
			t.Errorf("Do on a done mark of another type: %v (f ran: %v); want ErrCorrupt", err, ran)
		}
		must(t, rdb.Del(ctx, done).Err())
		must(t, rdb.HSet(ctx, done, "x", "1").Err())
		if d, err := o.Done(ctx); d || err != nil {
			t.Errorf("Done on a done hash without a value: %v, %v; want false, nil (as Do takes it)", d, err)
		}
		must(t, o.Do(ctx, func(context.Context) error { ran = true; return nil }))
		if !ran {
			t.Error("Do on a done hash without a value did not run f")
		}
		if d, err := o.Done(ctx); !d || err != nil {
			t.Errorf("Done after the run: %v, %v; want true", d, err)
		}
	})
}

// A run whose lease was lost while f ran, after which another call ran f
// and made the Once done, returns the Once's value when its own f then
// succeeds: the Once is done, and every caller sees the winner's result.
// A run whose f fails in the same position keeps its error (ErrLeaseLost).
func TestOnceLostRunnerGetsTheWinnersValue(t *testing.T) {
	for _, fails := range []bool{false, true} {
		t.Run(map[bool]string{false: "f succeeds", true: "f fails"}[fails], func(t *testing.T) {
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				rdb := b.NewClient(t)
				c1, c2 := newClient(t, b), newClient(t, b)
				var v2 []byte
				var err2 error
				v1, err1 := c1.Once(name).DoValue(ctx, func(fctx context.Context) ([]byte, error) {
					// The run lease is lost behind the runner's back ...
					must(t, rdb.Del(ctx, keys.ForOnce(dsync.DefaultPrefix, name).Run).Err())
					// ... another process runs f and succeeds ...
					v2, err2 = c2.Once(name).DoValue(ctx, func(context.Context) ([]byte, error) {
						return []byte("winner"), nil
					})
					// ... and this f ends as it would have anyway.
					if fails {
						return nil, errors.New("f failed")
					}
					return []byte("loser"), nil
				})
				if err2 != nil || string(v2) != "winner" {
					t.Fatalf("the call that took over: DoValue = %q, %v", v2, err2)
				}
				if fails {
					if !errors.Is(err1, dsync.ErrLeaseLost) || v1 != nil {
						t.Errorf("the lost run, f failed: DoValue = %q, %v; want ErrLeaseLost", v1, err1)
					}
				} else if err1 != nil || string(v1) != "winner" {
					t.Errorf("the lost run, f succeeded after the Once was done: DoValue = %q, %v; want \"winner\", nil", v1, err1)
				}
				v3, err3 := newClient(t, b).Once(name).DoValue(ctx, func(context.Context) ([]byte, error) {
					return []byte("third"), nil
				})
				if err3 != nil || string(v3) != "winner" {
					t.Errorf("a later call: DoValue = %q, %v; want \"winner\"", v3, err3)
				}
			})
		})
	}
}
