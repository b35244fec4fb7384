package dsync_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// ownerWaits is a primitive whose waiting calls of one owner the test
// below runs in two goroutines.
type ownerWaits struct {
	name string
	// block takes what makes the owner's calls wait, through a Client of
	// its own, and returns its release.
	block func(ctx context.Context, c *dsync.Client, n string) (func(context.Context) error, error)
	// calls returns the owner's lock and unlock calls on a handle made
	// through c, and another owner's try.
	calls func(c *dsync.Client, n string) (lock, unlock func(context.Context) error)
	try   func(ctx context.Context, c *dsync.Client, n string) (bool, error)
	// count returns the owner's count as Redis holds it ("" if none), and
	// placed whether the owner has a waiting place.
	count  func(rdb redis.UniversalClient, n, tok string) string
	placed func(rdb redis.UniversalClient, n string) bool
}

// blockWith returns the block of a hold that calls take and give back.
func blockWith(calls func(c *dsync.Client, n string) (lock, unlock func(context.Context) error)) func(ctx context.Context, c *dsync.Client, n string) (func(context.Context) error, error) {
	return func(ctx context.Context, c *dsync.Client, n string) (func(context.Context) error, error) {
		lock, unlock := calls(c, n)
		return unlock, lock(ctx)
	}
}

var ownerWaitCases = []ownerWaits{
	{
		name:  "RWMutex.Lock",
		block: blockWith(writeCalls),
		calls: writeCalls,
		try:   func(ctx context.Context, c *dsync.Client, n string) (bool, error) { return c.RWMutex(n).TryRLock(ctx) },
		count: func(rdb redis.UniversalClient, n, tok string) string {
			return ownerField(rdb, rwk(n).Writer, tok)
		},
		placed: func(rdb redis.UniversalClient, n string) bool {
			return rdb.Exists(context.Background(), rwk(n).WaitingWriters).Val() == 1
		},
	},
	{
		name:  "RWMutex.RLock",
		block: blockWith(writeCalls),
		calls: readCalls,
		try:   func(ctx context.Context, c *dsync.Client, n string) (bool, error) { return c.RWMutex(n).TryLock(ctx) },
		count: func(rdb redis.UniversalClient, n, tok string) string {
			// "<count> <hold id> <call ids>"
			return strings.SplitN(ownerField(rdb, rwk(n).ReaderData, tok), " ", 2)[0]
		},
		placed: func(rdb redis.UniversalClient, n string) bool {
			return rdb.Exists(context.Background(), rwk(n).WaitingReaders).Val() == 1
		},
	},
	{
		name: "Semaphore",
		block: func(ctx context.Context, c *dsync.Client, n string) (func(context.Context) error, error) {
			s := c.Semaphore(n, 2)
			return func(ctx context.Context) error { return s.Release(ctx, 2) }, s.Acquire(ctx, 2)
		},
		calls: func(c *dsync.Client, n string) (func(context.Context) error, func(context.Context) error) {
			s := c.Semaphore(n, 2)
			return func(ctx context.Context) error { return s.Acquire(ctx, 1) },
				func(ctx context.Context) error { return s.Release(ctx, 1) }
		},
		try: func(ctx context.Context, c *dsync.Client, n string) (bool, error) {
			return c.Semaphore(n, 2).TryAcquire(ctx, 2)
		},
		count: func(rdb redis.UniversalClient, n, tok string) string {
			return ownerField(rdb, semKeys(n).State, tok)
		},
		placed: func(rdb redis.UniversalClient, n string) bool {
			return rdb.ZCard(context.Background(), semKeys(n).Queue).Val() == 2
		},
	},
}

// ownerField returns the field of hash key named after owner tok (as it
// is, or qualified by a Client under client reentrancy), "" if none.
func ownerField(rdb redis.UniversalClient, key, tok string) string {
	m := rdb.HGetAll(context.Background(), key).Val()
	for f, v := range m {
		if f == tok || strings.HasPrefix(f, tok+"@") {
			return v
		}
	}
	return ""
}

// TestOwnerWaitingInTwoGoroutinesEveryPrimitive: as
// TestOwnerWaitingInTwoGoroutinesCountsTwice for Mutex, two goroutines of
// one owner wait, on RWMutex (write and read) and Semaphore: when they are
// let in, both return nil as two levels of the owner's hold (two permits),
// and the first release leaves it held (DESIGN, Waiting: a hand-over
// grants exactly one call; the owner's other call re-enters, counted), in
// both reentrancy modes.
func TestOwnerWaitingInTwoGoroutinesEveryPrimitive(t *testing.T) {
	for _, p := range ownerWaitCases {
		for _, mode := range []struct {
			name string
			opts []dsync.Option
			want string // the count Redis holds
		}{{"script", nil, "2"}, {"client", []dsync.Option{dsync.ClientReentrancy()}, "1"}} {
			t.Run(p.name+"/"+mode.name, func(t *testing.T) {
				eachBackend(t, func(t *testing.T, b redistest.Backend) {
					ctx := ctxT(t)
					name := redistest.Key(t)
					rdb := b.NewClient(t)
					release, err := p.block(ctx, newClient(t, b), name)
					if err != nil {
						t.Fatal(err)
					}
					octx := dsync.WithOwner(ctx)
					tok := dsync.OwnerToken(octx)
					lock, unlock := p.calls(newClient(t, b, mode.opts...), name)
					var wg sync.WaitGroup
					errs := make(chan error, 2)
					for range 2 {
						wg.Add(1)
						go func() {
							defer wg.Done()
							errs <- lock(octx)
						}()
					}
					waitFor(t, 5*time.Second, "the owner's waiting place", func() bool { return p.placed(rdb, name) })
					must(t, release(ctx))
					done := make(chan struct{})
					go func() { wg.Wait(); close(done) }()
					select {
					case <-done:
					case <-time.After(5 * time.Second):
						t.Fatal("the owner's calls still wait 5 s after the release")
					}
					close(errs)
					for err := range errs {
						if err != nil {
							t.Fatal(err)
						}
					}
					want := mode.want
					if p.name == "Semaphore" {
						want = "2" // permits, whatever counts re-entries
					}
					if v := p.count(rdb, name, tok); v != want {
						t.Fatalf("count in Redis = %q, want %s", v, want)
					}
					must(t, unlock(octx))
					if ok, err := p.try(ctx, newClient(t, b), name); ok || err != nil {
						t.Fatalf("another owner's try after one of two releases = %v, %v; want false", ok, err)
					}
					must(t, unlock(octx))
					if ok, err := p.try(ctx, newClient(t, b), name); !ok || err != nil {
						t.Fatalf("another owner's try after both releases = %v, %v; want true", ok, err)
					}
				})
			})
		}
	}
}
