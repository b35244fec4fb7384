package dsync_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// The end of a successful run is sent again, after a pause that doubles,
// as long as its replies are lost (for the release timeout at most): Do
// returns nil, as the Once is done. Before, three lost replies in a row,
// sent back to back (a blip of a few ms), made Do return the transport
// error although f had succeeded and the Once was done.
func TestOnceDoneWithLostRepliesOfItsEnd(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx, name := ctxT(t), redistest.Key(t)
		faults := scriptFaults("once_release")
		c, _ := hookedClient(t, b, faults)
		warm := c.Once(name + "-warm-up")
		must(t, warm.Do(ctx, func(context.Context) error { return nil })) // loads the script
		o := c.Once(name)
		faults.DropReplyNext(5, nil)
		ran := 0
		must(t, o.Do(ctx, func(context.Context) error { ran++; return nil }))
		if ran != 1 {
			t.Fatalf("f ran %d times, want 1", ran)
		}
		if n := faults.Injected(); n != 5 {
			t.Fatalf("%d replies of the end of the run were lost, want 5", n)
		}
		done, err := c.Once(name).Done(ctx)
		must(t, err)
		if !done {
			t.Fatal("the Once is not done after f returned nil")
		}
	})
}

// The end of a failed run whose reply was lost is sent again; the repeat
// answers as the first copy did. A run that held its lease to the end
// returns f's error alone: its lease was not lost. Before, the repeat found
// the end already applied and answered as for a run not the call's, and Do
// reported ErrLeaseLost. A run whose lease was lost (its key deleted during
// f) still reports ErrLeaseLost when the reply of its end was lost.
func TestOnceFailWithLostReplyOfItsEnd(t *testing.T) {
	for _, lost := range []bool{false, true} {
		what := "lease held"
		if lost {
			what = "lease lost"
		}
		t.Run(what, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b redistest.Backend) {
				ctx, name := ctxT(t), redistest.Key(t)
				faults := scriptFaults("once_release")
				c, _ := hookedClient(t, b, faults)
				plain := b.NewClient(t)
				warm := c.Once(name + "-warm-up")
				must(t, warm.Do(ctx, func(context.Context) error { return nil })) // loads the script
				o := c.Once(name)
				failed := errors.New("f failed")
				err := o.Do(ctx, func(context.Context) error {
					if lost {
						must(t, plain.Del(ctx, onceKeys(name).Run).Err())
					}
					faults.DropReplyNext(1, nil)
					return failed
				})
				if n := faults.Injected(); n != 1 {
					t.Fatalf("%d replies of the end of the run were lost, want 1", n)
				}
				if !errors.Is(err, failed) {
					t.Fatalf("Do = %v, want f's error", err)
				}
				if got := errors.Is(err, dsync.ErrLeaseLost); got != lost {
					t.Fatalf("Do = %v: ErrLeaseLost %v, want %v", err, got, lost)
				}
				if n, err := plain.Exists(ctx, onceKeys(name).Run, onceKeys(name).Done).Result(); err != nil || n != 0 {
					t.Fatalf("%d keys of the run or the done mark left after a failed run (%v)", n, err)
				}
				ran := false
				must(t, c.Once(name).Do(ctx, func(context.Context) error { ran = true; return nil }))
				if !ran {
					t.Fatal("f did not run again after the failed run")
				}
			})
		})
	}
}

// resetThenDo lets the first matching command run, then runs do, then
// loses the command's reply.
type resetThenDo struct {
	sha  string
	do   func()
	done atomic.Bool
}

func (h *resetThenDo) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *resetThenDo) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if a := cmd.Args(); cmd.Name() == "evalsha" && len(a) > 1 && a[1] == h.sha && err == nil && h.done.CompareAndSwap(false, true) {
			h.do()
			return redistest.ErrInjected
		}
		return err
	}
}

func (h *resetThenDo) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A Reset whose reply was lost is sent again as the same call: it returns
// nil, and it removes nothing more. Here another process's Do runs f and
// marks the Once done between the first copy, which took effect, and the
// repeat: that done mark stays. Before, the lost reply was Reset's error,
// and a caller's retry, a new Reset, removed that mark.
func TestOnceResetWithLostReply(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx, name := ctxT(t), redistest.Key(t)
		other := newClient(t, b).Once(name)
		runs := 0
		h := &resetThenDo{sha: lua.Script("once_reset").Hash(), do: func() {
			must(t, other.Do(ctx, func(context.Context) error { runs++; return nil }))
		}}
		c, rdb := hookedClient(t, b, h)
		for _, n := range lua.Names() {
			must(t, lua.Script(n).Load(ctx, rdb).Err()) // an EVALSHA runs the Reset
		}
		o := c.Once(name)
		must(t, o.Do(ctx, func(context.Context) error { return nil }))
		must(t, o.Reset(ctx))
		if !h.done.Load() || runs != 1 {
			t.Fatalf("the reply of the Reset was lost %v, f ran in between %d times; want true, 1", h.done.Load(), runs)
		}
		done, err := o.Done(ctx)
		must(t, err)
		if !done {
			t.Fatal("the repeat of the Reset removed the done mark of a run that succeeded after the Reset took effect")
		}
	})
}
