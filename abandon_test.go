package dsync_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// scriptFaults returns Faults that affect only the script called name
// (see lua.Script).
func scriptFaults(name string) *redistest.Faults {
	sha := lua.Script(name).Hash()
	f := &redistest.Faults{}
	f.Match(func(cmd redis.Cmder) bool {
		a := cmd.Args()
		return cmd.Name() == "evalsha" && len(a) > 1 && a[1] == sha
	})
	return f
}

// A call whose reply was lost after the server gave it a hold has it
// undone in the background; an undo that fails on the way (a connection
// cut) is tried again, so the hold is not left, renewed by nobody, for its
// whole TTL (30 s here): once the Client's clean-ups are over, another
// process takes the name at once.
func TestAbandonTriedAgainAfterAFailure(t *testing.T) {
	kinds := []struct {
		name, attempt, undo string
		// take takes the name through c (its reply is lost).
		take func(ctx context.Context, c *dsync.Client, name string) error
		// try takes the name through another Client at once, or not.
		try func(ctx context.Context, c *dsync.Client, name string) (bool, error)
	}{
		{"Mutex", "mutex_lock", "mutex_unlock",
			func(ctx context.Context, c *dsync.Client, n string) error { return c.Mutex(n).Lock(ctx) },
			func(ctx context.Context, c *dsync.Client, n string) (bool, error) { return c.Mutex(n).TryLock(ctx) }},
		{"RWMutex.Lock", "rwmutex_lock", "rwmutex_unlock",
			func(ctx context.Context, c *dsync.Client, n string) error { return c.RWMutex(n).Lock(ctx) },
			func(ctx context.Context, c *dsync.Client, n string) (bool, error) { return c.RWMutex(n).TryLock(ctx) }},
		{"RWMutex.RLock", "rwmutex_lock", "rwmutex_unlock",
			func(ctx context.Context, c *dsync.Client, n string) error { return c.RWMutex(n).RLock(ctx) },
			func(ctx context.Context, c *dsync.Client, n string) (bool, error) { return c.RWMutex(n).TryLock(ctx) }},
		{"Semaphore", "semaphore_acquire", "semaphore_abandon",
			func(ctx context.Context, c *dsync.Client, n string) error { return c.Semaphore(n, 2).Acquire(ctx, 2) },
			func(ctx context.Context, c *dsync.Client, n string) (bool, error) {
				return c.Semaphore(n, 2).TryAcquire(ctx, 2)
			}},
		{"Once", "once_do", "once_release",
			func(ctx context.Context, c *dsync.Client, n string) error {
				return c.Once(n).Do(ctx, func(context.Context) error { return nil })
			},
			func(ctx context.Context, c *dsync.Client, n string) (bool, error) {
				ran := false
				err := c.Once(n).Do(ctx, func(context.Context) error { ran = true; return nil })
				return ran, err
			}},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				attempt, undo := scriptFaults(k.attempt), scriptFaults(k.undo)
				rdb := b.NewClient(t)
				rdb.AddHook(attempt)
				rdb.AddHook(undo)
				c := dsync.New(rdb)
				t.Cleanup(func() { c.Close() })
				// Load the scripts first: a fault stands in for go-redis's
				// NOSCRIPT fallback otherwise.
				must(t, k.take(ctx, c, name+"-warm"))
				attempt.DropReplyNext(1, errors.New("i/o timeout"))
				undo.FailNext(3, errors.New("connection reset"))
				if err := k.take(ctx, c, name); err == nil {
					t.Fatal("the call whose reply was lost returned nil")
				}
				dsync.WaitCleanups(c)
				if n := undo.Injected(); n != 3 {
					t.Fatalf("the undo failed %d times, want 3 (then taken again)", n)
				}
				ok, err := k.try(ctx, newClient(t, b), name)
				if err != nil || !ok {
					t.Fatalf("another process after the clean-up: %v, %v; want the name at once (the undo was not tried again)", ok, err)
				}
			})
		})
	}
}
