package dsync_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A run whose lease was lost, after which another call made the Once
// done, gets that call's value when its own f succeeds; the reply of its
// end is lost and the end is sent again: the repeat answers as the first
// copy did, and DoValue returns the winner's value, not ErrLeaseLost.
func TestOnceLostRunnerGetsTheWinnersValueAfterALostReply(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		faults := scriptFaults("once_release")
		c1, _ := hookedClient(t, b, faults)
		must(t, c1.Once(name+"-warm-up").Do(ctx, func(context.Context) error { return nil })) // loads the script
		c2 := newClient(t, b)
		v1, err1 := c1.Once(name).DoValue(ctx, func(context.Context) ([]byte, error) {
			must(t, rdb.Del(ctx, onceKeys(name).Run).Err())
			v2, err2 := c2.Once(name).DoValue(ctx, func(context.Context) ([]byte, error) {
				return []byte("winner"), nil
			})
			if err2 != nil || string(v2) != "winner" {
				t.Errorf("the call that took over: DoValue = %q, %v", v2, err2)
			}
			faults.DropReplyNext(1, nil)
			return []byte("loser"), nil
		})
		if n := faults.Injected(); n != 1 {
			t.Fatalf("%d replies of the end of the run were lost, want 1", n)
		}
		if err1 != nil || string(v1) != "winner" {
			t.Errorf("the lost run, its end's reply lost: DoValue = %q, %v; want \"winner\", nil", v1, err1)
		}
	})
}

// Waiters of a run whose f panics are not left to wait for the lease's
// TTL: one of them runs f at once.
func TestOncePanicWithWaitersHandsOver(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		c := newClient(t, b) // 30 s TTL
		started, boom := make(chan struct{}), make(chan struct{})
		panicked := make(chan any, 1)
		go func() {
			defer func() { panicked <- recover() }()
			_ = c.Once(name).Do(ctx, func(context.Context) error {
				close(started)
				<-boom
				panic("boom")
			})
		}()
		<-started
		waiter := async(func() error {
			return newClient(t, b).Once(name).Do(ctx, func(context.Context) error { return nil })
		})
		waitWaitedFor(t, ctx, rdb, name)
		close(boom)
		if p := <-panicked; p != "boom" {
			t.Fatalf("recovered %v, want boom", p)
		}
		recvNil(t, waiter, 10*time.Second, "the waiter did not take over within 10 s of the panic")
	})
}

// runtime.Goexit in f (t.FailNow, say) releases the run as a panic does.
func TestOnceGoexitReleasesTheRun(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = c.Once(name).Do(ctx, func(context.Context) error {
				runtime.Goexit()
				return nil
			})
		}()
		<-done
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		assertDoRuns(t, qctx, newClient(t, b).Once(name), "Do after a Goexit")
	})
}

// Every caller of DoValue gets exactly the winner's bytes, also when they
// are large and binary, or empty.
func TestOnceValueLargeBinaryAndEmpty(t *testing.T) {
	big := make([]byte, 4<<20)
	_, _ = rand.Read(big)
	bin := []byte{0, 0xff, '\r', '\n', 0, '$', '*', 0x80}
	for _, c := range []struct {
		what string
		v    []byte
	}{{"big", big}, {"binary", bin}, {"empty", []byte{}}, {"nil", nil}} {
		t.Run(c.what, func(t *testing.T) {
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				cs := []*dsync.Client{newClient(t, b), newClient(t, b), newClient(t, b)}
				started, finish := make(chan struct{}), make(chan struct{})
				runner := make(chan []byte, 1)
				go func() {
					v, err := cs[0].Once(name).DoValue(ctx, func(context.Context) ([]byte, error) {
						close(started)
						<-finish
						return c.v, nil
					})
					if err != nil {
						t.Error(err)
					}
					runner <- v
				}()
				<-started
				const waiters = 4
				got := make([][]byte, waiters)
				var wg sync.WaitGroup
				for i := range waiters {
					wg.Add(1)
					go func() {
						defer wg.Done()
						v, err := cs[1+i%2].Once(name).DoValue(ctx, func(context.Context) ([]byte, error) {
							t.Error("a waiter ran f")
							return []byte("other"), nil
						})
						if err != nil {
							t.Error(err)
						}
						got[i] = v
					}()
				}
				waitWaitedFor(t, ctx, b.NewClient(t), name)
				close(finish)
				wg.Wait()
				rv := <-runner
				want := c.v
				if len(want) == 0 {
					want = nil
				}
				if !bytes.Equal(rv, want) || (want == nil) != (rv == nil) {
					t.Errorf("runner got %d bytes (nil %v), want %d", len(rv), rv == nil, len(want))
				}
				for i, v := range got {
					if !bytes.Equal(v, want) || (want == nil) != (v == nil) {
						t.Errorf("waiter %d got %d bytes (nil %v), want %d", i, len(v), v == nil, len(want))
					}
				}
				later, err := newClient(t, b).Once(name).DoValue(ctx, func(context.Context) ([]byte, error) {
					t.Error("f ran after done")
					return nil, nil
				})
				if err != nil || !bytes.Equal(later, want) {
					t.Errorf("later DoValue = %d bytes, %v", len(later), err)
				}
			})
		})
	}
}

// errHunt is the error of a failing f.
var errHunt = errors.New("hunt")

// Many Clients on one name, with Resets in between: f never runs in two
// calls at once, and every DoValue that succeeds returns the value of a
// run that succeeded, never nil.
func TestOnceHammerWithResets(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const clients, perClient, rounds = 6, 3, 15
		var running, runs, overlaps atomic.Int64
		var produced sync.Map
		var wg sync.WaitGroup
		for i := range clients {
			c := newClient(t, b)
			for j := range perClient {
				wg.Add(1)
				go func() {
					defer wg.Done()
					o := c.Once(name)
					for r := range rounds {
						if (i+j+r)%7 == 0 {
							if err := o.Reset(ctx); err != nil {
								t.Error(err)
							}
							continue
						}
						v, err := o.DoValue(ctx, func(context.Context) ([]byte, error) {
							if running.Add(1) != 1 {
								overlaps.Add(1)
							}
							defer running.Add(-1)
							n := runs.Add(1)
							time.Sleep(time.Millisecond)
							if n%5 == 0 {
								return nil, errHunt
							}
							v := fmt.Appendf(nil, "run %d by %d/%d", n, i, j)
							produced.Store(string(v), true)
							return v, nil
						})
						if errors.Is(err, errHunt) {
							continue
						}
						if err != nil {
							t.Errorf("DoValue = %v", err)
							continue
						}
						if _, ok := produced.Load(string(v)); !ok {
							t.Errorf("DoValue = %q, no run produced it", v)
						}
					}
				}()
			}
		}
		wg.Wait()
		if n := overlaps.Load(); n != 0 {
			t.Errorf("f ran in two calls at once %d times", n)
		}
		t.Logf("%d runs", runs.Load())
	})
}

// A Client closed makes every call on its Once fail with ErrClosed, f
// not called.
func TestOnceAfterClose(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := dsync.New(b.NewClient(t))
		o := c.Once(name)
		must(t, o.Do(ctx, func(context.Context) error { return nil }))
		c.Close()
		ran := false
		checkIs(t, o.Do(ctx, func(context.Context) error { ran = true; return nil }), dsync.ErrClosed, "Do after Close = %v, want ErrClosed")
		_, err := o.DoValue(ctx, func(context.Context) ([]byte, error) { ran = true; return nil, nil })
		checkIs(t, err, dsync.ErrClosed, "DoValue after Close = %v, want ErrClosed")
		_, err = o.Done(ctx)
		checkIs(t, err, dsync.ErrClosed, "Done after Close = %v, want ErrClosed")
		checkIs(t, o.Reset(ctx), dsync.ErrClosed, "Reset after Close = %v, want ErrClosed")
		_, err = c.Once(name+"x").DoValue(ctx, func(context.Context) ([]byte, error) { ran = true; return nil, nil })
		checkIs(t, err, dsync.ErrClosed, "DoValue of a new handle after Close = %v, want ErrClosed")
		if ran {
			t.Error("f ran after Close")
		}
	})
}

// f that succeeds after its caller's ctx ended: Do returns ctx's error,
// the run ends in the background and marks the Once done, and the
// waiters get its value.
func TestOnceSuccessAfterCallerCtxEndedReachesWaiters(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		cctx, cancel := context.WithCancel(ctx)
		started, finish := make(chan struct{}), make(chan struct{})
		runner := make(chan error, 1)
		go func() {
			_, err := c.Once(name).DoValue(cctx, func(fctx context.Context) ([]byte, error) {
				close(started)
				<-finish
				<-fctx.Done()
				return []byte("late"), nil
			})
			runner <- err
		}()
		<-started
		got := make(chan []byte, 1)
		waiter := async(func() error {
			v, err := newClient(t, b).Once(name).DoValue(ctx, func(context.Context) ([]byte, error) {
				return []byte("waiter"), nil
			})
			got <- v
			return err
		})
		waitWaitedFor(t, ctx, b.NewClient(t), name)
		cancel()
		close(finish)
		if err := <-runner; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("runner's DoValue = %v, want nil or context.Canceled", err)
		}
		recvNil(t, waiter, 10*time.Second, "waiter did not return")
		if v := <-got; string(v) != "late" {
			t.Errorf("waiter got %q, want late", v)
		}
		dsync.WaitCleanups(c)
		if d, err := c.Once(name).Done(ctx); !d || err != nil {
			t.Errorf("Done = %v, %v; want true", d, err)
		}
	})
}

// A call whose run lease ran out before the reply that granted it came
// back (a server or network stall longer than the TTL) does not call f:
// another call may run f by then. Its Do returns an error matching
// ErrLeaseLost, as documented ("whose run lease was lost before f could
// start (f is then not called)"). Here another call takes the run in the
// meantime and is running f when the late grant arrives.
func TestOnceGrantThatArrivesAfterItsLeaseDoesNotRunF(t *testing.T) {
	eachRealName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const ttl = 500 * time.Millisecond
		rdb := b.NewClient(t)
		hk := newOnceHook()
		c, _ := hookedClient(t, b, hk, dsync.TTL(ttl))
		must(t, c.Once(name+"-warm-up").Do(ctx, func(context.Context) error { return nil })) // loads the script
		other := newClient(t, b)
		bStarted, bFinish := make(chan struct{}), make(chan struct{})
		bDone := make(chan error, 1)
		var bRunning atomic.Bool
		hk.on("once_do", func(run func() error) error {
			err := run() // takes the run
			// The reply is held up until the run lease ran out on the
			// server and another call took the run.
			waitFor(t, 10*time.Second, "the run lease to run out", func() bool {
				n, _ := rdb.Exists(ctx, onceKeys(name).Run).Result()
				return n == 0
			})
			go func() {
				bDone <- other.Once(name).Do(ctx, func(context.Context) error {
					bRunning.Store(true)
					defer bRunning.Store(false)
					close(bStarted)
					<-bFinish
					return nil
				})
			}()
			<-bStarted
			return err
		})
		ran, overlapped := false, false
		err := c.Once(name).Do(ctx, func(context.Context) error {
			ran, overlapped = true, bRunning.Load()
			return nil
		})
		close(bFinish)
		if err := <-bDone; err != nil {
			t.Errorf("the call that took over: Do = %v", err)
		}
		if ran {
			t.Errorf("f ran on a grant whose lease had run out (while another call ran f: %v)", overlapped)
		}
		checkIs(t, err, dsync.ErrLeaseLost, "Do on a grant whose lease had run out = %v, want ErrLeaseLost")
	})
}

// A run whose lease was lost (its key deleted: eviction, a failover, an
// operator) and whose f then fails wakes the waiters, as a run that
// succeeds in that position does: nobody runs f any more, and they would
// otherwise sleep until the lost lease's TTL (30 s here) before one of
// them runs f.
func TestOnceFailedLostRunWakesTheWaiters(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		c := newClient(t, b) // 30 s TTL
		started, fail := make(chan struct{}), make(chan struct{})
		runner := make(chan error, 1)
		go func() {
			runner <- c.Once(name).Do(ctx, func(context.Context) error {
				close(started)
				<-fail
				return errHunt
			})
		}()
		<-started
		wc, _, rec := recorded(t, b)
		waiter := async(func() error {
			return wc.Once(name).Do(ctx, func(context.Context) error { return nil })
		})
		// The waiter's first attempt, and the one it makes once its
		// notifications are subscribed, were refused: it sleeps now.
		waitFor(t, 10*time.Second, "the waiter's two attempts", func() bool {
			return len(rec.All()) > 0 && len(onceDoCalls(t, rec)) >= 2
		})
		waitWaitedFor(t, ctx, rdb, name)
		must(t, rdb.Del(ctx, onceKeys(name).Run).Err()) // the lease is lost
		close(fail)
		if err := <-runner; !errors.Is(err, errHunt) || !errors.Is(err, dsync.ErrLeaseLost) {
			t.Errorf("runner's Do = %v, want f's error and ErrLeaseLost", err)
		}
		recvNil(t, waiter, 10*time.Second, "the waiter did not run f within 10 s of the failed run's end")
	})
}
