package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

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

// A re-entry whose reply was lost is undone by its abandon also when more
// re-entries of the same owner than the hold's list of applied calls keeps
// (16) came before the abandon arrived: the abandon finds the call in the
// call ids zset and lowers the count once (a late copy of it changes
// nothing), so the owner's Unlocks, one per Lock it was told succeeded,
// free the name.
func TestAbandonAfterManyReentries(t *testing.T) {
	const more = 20
	kinds := []struct {
		name, attempt, undo string
		lock                func(ctx context.Context, c *dsync.Client, name string) error
		unlock              func(ctx context.Context, c *dsync.Client, name string) error
	}{
		{"Mutex", "mutex_lock", "mutex_unlock",
			func(ctx context.Context, c *dsync.Client, n string) error { return c.Mutex(n).Lock(ctx) },
			func(ctx context.Context, c *dsync.Client, n string) error { return c.Mutex(n).Unlock(ctx) }},
		{"RWMutex.Lock", "rwmutex_lock", "rwmutex_unlock",
			func(ctx context.Context, c *dsync.Client, n string) error { return c.RWMutex(n).Lock(ctx) },
			func(ctx context.Context, c *dsync.Client, n string) error { return c.RWMutex(n).Unlock(ctx) }},
		{"RWMutex.RLock", "rwmutex_lock", "rwmutex_unlock",
			func(ctx context.Context, c *dsync.Client, n string) error { return c.RWMutex(n).RLock(ctx) },
			func(ctx context.Context, c *dsync.Client, n string) error { return c.RWMutex(n).RUnlock(ctx) }},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			eachOwnerName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				attempt := scriptFaults(k.attempt)
				gate := &unlockGate{sha: lua.Script(k.undo).Hash()}
				c, rdb := hookedClient(t, b, attempt)
				rdb.AddHook(gate)
				rec := &redistest.Recorder{}
				rdb.AddHook(rec)
				must(t, k.lock(ctx, c, name)) // the hold; the scripts loaded
				gate.close()
				attempt.DropReplyNext(1, errors.New("i/o timeout"))
				// The call waits for its abandon while its ctx lives.
				lost := async(func() error { return k.lock(ctx, c, name) })
				waitFor(t, 10*time.Second, "the abandon, held at the gate", func() bool { return gate.held.Load() == 1 })
				for i := 0; i < more; i++ {
					must(t, k.lock(ctx, c, name))
				}
				gate.open()
				select {
				case err := <-lost:
					if err == nil {
						t.Fatal("the re-entry whose reply was lost returned nil")
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the re-entry whose reply was lost did not return")
				}
				dsync.WaitCleanups(c)
				// A copy of the abandon, arriving late, lowers nothing again.
				sha := lua.Script(k.undo).Hash()
				for _, a := range rec.All() {
					if a[1] == sha {
						must(t, rdb.Do(ctx, a...).Err())
					}
				}
				for i := 0; i < 1+more; i++ {
					must(t, k.unlock(ctx, c, name))
				}
				// Another process, with no owner.
				octx := ctxT(t)
				ok, err := newClient(t, b).RWMutex(name).TryLock(octx)
				if k.name == "Mutex" {
					ok, err = newClient(t, b).Mutex(name).TryLock(octx)
				}
				if err != nil || !ok {
					t.Fatalf("another process after the owner's %d Unlocks: %v, %v; want the name (the lost re-entry was not undone)", 1+more, ok, err)
				}
			})
		})
	}
}
