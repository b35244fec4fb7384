package dsync_test

import (
	"context"
	"testing"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A successful run whose done mark was set but whose reply was lost, and
// whose mark is gone by the time the end is sent again (a Reset, or the
// end of a short Period), held its lease to the end: Do must not report
// ErrLeaseLost ("another call took over the run") for a run that nobody
// took over and whose success was recorded.
func TestOnceLostReplyOfADoneMarkGoneSinceIsNoLeaseLoss(t *testing.T) {
	b, ctx, name := realName(t)
	hk := newOnceHook()
	c, rdb := hookedClient(t, b, hk)
	must(t, c.Once(name+"-warm-up").Do(ctx, func(context.Context) error { return nil })) // loads the script
	k := keys.ForOnce(dsync.DefaultPrefix, name)
	ran := false
	hk.on("once_release", func(run func() error) error {
		if err := run(); err != nil {
			return err
		}
		ran = true
		// The mark is gone before the caller, whose reply is lost, sends
		// the end again.
		must(t, rdb.Del(ctx, k.Done).Err())
		return redistest.ErrInjected
	})
	calls := 0
	err := c.Once(name).Do(ctx, func(context.Context) error { calls++; return nil })
	if calls != 1 || !ran {
		t.Fatalf("f ran %d times; the end ran: %v", calls, ran)
	}
	if err != nil {
		t.Errorf("Do = %v, want nil: a run that held its lease and whose done mark was set", err)
	}
	if tok, _ := rdb.HGet(ctx, k.Run, "t").Result(); tok != "" {
		t.Errorf("the run hash is still held by %q", tok)
	}
}
