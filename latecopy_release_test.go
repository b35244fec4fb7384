package dsync_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A release an owner sends while its Client records no hold of the owner
// on the name (the hold was lost, or already released) must not end a
// hold the owner takes after it was sent: delivered late, it would leave
// the owner believing it holds what Redis has freed, and another holder
// would come in beside it. Such a release names the owner's last hold
// recorded there, so it ends nothing later.

// ownerReleaseKind is one kind of owner hold: two levels (permits) of it
// taken by two goroutines of one owner, its release, the keys whose
// deletion loses it, and a try by another Client that succeeds only while
// the name has room for another holder.
type ownerReleaseKind struct {
	name, script string
	handle       func(c *dsync.Client, name string, opts ...dsync.Option) (take, release func(context.Context) error)
	state        func(name string) []string
	idKey        func(name string) string
	other        func(ctx context.Context, c *dsync.Client, name string) (bool, error)
}

func ownerReleaseKinds() []ownerReleaseKind {
	const size = 2 // the Semaphore's: the owner's two permits fill it
	return []ownerReleaseKind{
		{"Mutex", "mutex_unlock", func(c *dsync.Client, n string, opts ...dsync.Option) (func(context.Context) error, func(context.Context) error) {
			m := c.Mutex(n, opts...)
			return m.Lock, m.Unlock
		}, func(n string) []string { return []string{mutexKeys(n).Lock} },
			func(n string) string { return mutexKeys(n).Calls },
			func(ctx context.Context, c *dsync.Client, n string) (bool, error) { return c.Mutex(n).TryLock(ctx) }},
		{"RWMutex write", "rwmutex_unlock", func(c *dsync.Client, n string, opts ...dsync.Option) (func(context.Context) error, func(context.Context) error) {
			rw := c.RWMutex(n, opts...)
			return rw.Lock, rw.Unlock
		}, func(n string) []string { return []string{rwk(n).Writer} },
			func(n string) string { return rwk(n).Calls },
			func(ctx context.Context, c *dsync.Client, n string) (bool, error) { return c.RWMutex(n).TryLock(ctx) }},
		{"RWMutex read", "rwmutex_unlock", func(c *dsync.Client, n string, opts ...dsync.Option) (func(context.Context) error, func(context.Context) error) {
			rw := c.RWMutex(n, opts...)
			return rw.RLock, rw.RUnlock
		}, func(n string) []string { return []string{rwk(n).Readers, rwk(n).ReaderData} },
			func(n string) string { return rwk(n).Calls },
			func(ctx context.Context, c *dsync.Client, n string) (bool, error) { return c.RWMutex(n).TryLock(ctx) }},
		{"Semaphore", "semaphore_release", func(c *dsync.Client, n string, opts ...dsync.Option) (func(context.Context) error, func(context.Context) error) {
			s := c.Semaphore(n, size, opts...)
			return func(ctx context.Context) error { return s.Acquire(ctx, 1) },
				func(ctx context.Context) error { return s.Release(ctx, 1) }
		}, func(n string) []string { return []string{semKeys(n).State, semKeys(n).Holders} },
			func(n string) string { return semKeys(n).Calls },
			func(ctx context.Context, c *dsync.Client, n string) (bool, error) {
				return c.Semaphore(n, size).TryAcquire(ctx, 1)
			}},
	}
}

// recordRelease runs release with a recorder on its Client's connection,
// and returns the arguments of the last run of script it sent and the
// release's error.
func recordRelease(t *testing.T, rec *redistest.Recorder, script string, release func() error) ([]any, error) {
	t.Helper()
	var err error
	args := recordAttempt(t, rec, script, func() error { err = release(); return nil })
	return args, err
}

// deliverLate runs a copy of a recorded release as a first delivery: the
// name's call ids are forgotten first, as happens when the copy is the
// first to arrive.
func deliverLate(t *testing.T, ctx context.Context, rdb redis.UniversalClient, idKey string, args []any) {
	t.Helper()
	must(t, rdb.Del(ctx, idKey).Err())
	if err := rdb.Do(ctx, args...).Err(); err != nil {
		t.Fatalf("the late copy of the release: %v", err)
	}
}

// stillHeld checks that the owner's hold is still there in Redis: another
// Client finds no room, and the owner's last release ends it.
func (k ownerReleaseKind) stillHeld(t *testing.T, ctx context.Context, other *dsync.Client, name string, release func(context.Context) error) {
	t.Helper()
	octx := dsync.WithOwner(ctxT(t))
	if ok, err := k.other(octx, other, name); err != nil || ok {
		t.Fatalf("another Client's try while the owner holds again = %v, %v; want false (two holders)", ok, err)
	}
	must(t, release(ctx))
}

// The levels of a lost hold: goroutine A's release learns the loss,
// goroutine B's release (sent while the Client still records the lost
// hold's second level) is delivered after the owner took the name afresh,
// and ends nothing of the new hold.
func TestLateReleaseOfALostLevelEndsNoLaterHold(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, k := range ownerReleaseKinds() {
			t.Run(strings.ReplaceAll(k.name, " ", "-"), func(t *testing.T) {
				rec := &redistest.Recorder{}
				c, rdb := hookedClient(t, b, rec)
				other := newClient(t, b)
				name := redistest.Key(t)
				ctx := dsync.WithOwner(ctxT(t))
				take, release := k.handle(c, name)
				must(t, take(ctx)) // goroutine A
				must(t, take(ctx)) // goroutine B
				must(t, rdb.Del(ctx, k.state(name)...).Err())
				mustIs(t, release(ctx), dsync.ErrLeaseLost, "A's release after the loss = %v, want ErrLeaseLost")
				args, err := recordRelease(t, rec, k.script, func() error { return release(ctx) })
				must(t, take(ctx)) // goroutine C, afresh
				if k.name == "Semaphore" {
					must(t, take(ctx)) // and its second permit
				}
				deliverLate(t, ctx, rdb, k.idKey(name), args)
				k.stillHeld(t, ctx, other, name, release)
				// B's level went with the lost hold: its release found
				// nothing to end.
				mustIs(t, err, dsync.ErrNotHeld, "B's release after the loss = %v, want ErrNotHeld")
			})
		}
	})
}

// The same after a new hold took the lost one's levels (see
// TestOwnerLevelsOfALostHoldAreGone): goroutine C takes the name afresh,
// B's release ends C's hold, and A's release, sent while the Client
// records no hold of the owner, is delivered after D took the name again:
// it ends nothing of D's hold.
func TestLateReleaseOfALevelOfAnEndedHoldEndsNoLaterHold(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, k := range ownerReleaseKinds() {
			t.Run(strings.ReplaceAll(k.name, " ", "-"), func(t *testing.T) {
				rec := &redistest.Recorder{}
				c, rdb := hookedClient(t, b, rec)
				other := newClient(t, b)
				name := redistest.Key(t)
				ctx := dsync.WithOwner(ctxT(t))
				take, release := k.handle(c, name)
				must(t, take(ctx)) // goroutine A
				must(t, take(ctx)) // goroutine B
				must(t, rdb.Del(ctx, k.state(name)...).Err())
				must(t, take(ctx)) // goroutine C, afresh
				must(t, release(ctx))
				args, err := recordRelease(t, rec, k.script, func() error { return release(ctx) })
				mustIs(t, err, dsync.ErrNotHeld, "A's release after C's hold ended = %v, want ErrNotHeld")
				must(t, take(ctx)) // goroutine D
				if k.name == "Semaphore" {
					must(t, take(ctx))
				}
				deliverLate(t, ctx, rdb, k.idKey(name), args)
				k.stillHeld(t, ctx, other, name, release)
			})
		}
	})
}

// The same under client reentrancy, where the Client counts the levels:
// once the Client knows the loss (a renewal found it), A's release ends
// the lost hold's record, and B's, delivered late, ends nothing of C's.
func TestLateReleaseOfALostLevelUnderClientReentrancy(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, k := range ownerReleaseKinds() {
			if k.name == "Semaphore" {
				continue // no client reentrancy
			}
			t.Run(strings.ReplaceAll(k.name, " ", "-"), func(t *testing.T) {
				rec := &redistest.Recorder{}
				c, rdb := hookedClient(t, b, rec)
				other := newClient(t, b)
				name := redistest.Key(t)
				ctx := dsync.WithOwner(ctxT(t))
				take, release := k.handle(c, name, dsync.ClientReentrancy(), dsync.RenewEvery(20*time.Millisecond))
				must(t, take(ctx)) // goroutine A
				must(t, take(ctx)) // goroutine B, a re-entry in the Client
				var l *dsync.Lease
				var err error
				switch rw := c.RWMutex(name, dsync.ClientReentrancy()); k.name {
				case "Mutex":
					l, err = c.Mutex(name, dsync.ClientReentrancy()).Lease(ctx)
				case "RWMutex write":
					l, err = rw.Lease(ctx)
				default:
					l, err = rw.RLease(ctx)
				}
				must(t, err)
				must(t, rdb.Del(ctx, k.state(name)...).Err())
				waitDone(t, l, 10*time.Second, "the keys' deletion")
				mustIs(t, release(ctx), dsync.ErrLeaseLost, "A's release after the loss = %v, want ErrLeaseLost")
				args, err := recordRelease(t, rec, k.script, func() error { return release(ctx) })
				must(t, take(ctx)) // goroutine C, afresh
				deliverLate(t, ctx, rdb, k.idKey(name), args)
				k.stillHeld(t, ctx, other, name, release)
				mustIs(t, err, dsync.ErrNotHeld, "B's release after the loss = %v, want ErrNotHeld")
			})
		}
	})
}
