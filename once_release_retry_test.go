package dsync_test

import (
	"context"
	"testing"

	"github.com/dsync-go/dsync/internal/redistest"
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
