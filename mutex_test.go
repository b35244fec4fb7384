package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/internal/redistest"
)

func TestMutexExcludesAcrossClients(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const clients, perClient, rounds = 3, 3, 20
		var h mutexHolders
		pause := func() time.Duration { return time.Duration(rand.IntN(200)) * time.Microsecond }
		hammerClients(t, b, clients, perClient, rounds, func(c *dsync.Client, _ int) func() error {
			// One handle per goroutine, and no owner.
			return h.step(ctx, c.Mutex(name), pause, nil)
		})
		h.check(t, clients*perClient*rounds)
		assertNoLockKeys(t, b, name)
	})
}

// mutexHolders counts the holds of a Mutex in a hammer test: how many are
// inside at once, the most there ever were, and how many there were.
type mutexHolders struct{ inside, most, total atomic.Int64 }

// step returns a hammer step that locks m, counts the hold, calls during
// (unless nil) while it holds, sleeps for pause(), leaves and unlocks.
func (h *mutexHolders) step(ctx context.Context, m *dsync.Mutex, pause func() time.Duration, during func()) func() error {
	return func() error {
		if err := m.Lock(ctx); err != nil {
			return fmt.Errorf("Lock: %w", err)
		}
		n := h.inside.Add(1)
		if n > h.most.Load() {
			h.most.Store(n)
		}
		if during != nil {
			during()
		}
		h.total.Add(1)
		time.Sleep(pause())
		h.inside.Add(-1)
		if err := m.Unlock(ctx); err != nil {
			return fmt.Errorf("Unlock: %w", err)
		}
		return nil
	}
}

// check reports holds that overlapped and a number of holds other than
// want.
func (h *mutexHolders) check(t *testing.T, want int64) {
	t.Helper()
	if got := h.most.Load(); got != 1 {
		t.Errorf("holders at once = %d, want 1", got)
	}
	if got := h.total.Load(); got != want {
		t.Errorf("acquisitions = %d, want %d", got, want)
	}
}

// mutexKeys returns the keys of the Mutex called name.
func mutexKeys(name string) keys.Mutex { return keys.ForMutex(dsync.DefaultPrefix, name) }

// replayWindow is how long a Mutex remembers call ids (REPLAY_MS in
// lua/lib.lua).
const replayWindow = 60 * time.Second

// assertNoLockKeys checks that a released lock left only bookkeeping behind:
// see assertBookkeepingOnly.
func assertNoLockKeys(t *testing.T, b redistest.Backend, name string) {
	t.Helper()
	ks := mutexKeys(name)
	assertBookkeepingOnly(t, b, ks.Keys(), ks.Fence, ks.Calls)
}

func TestMutexTryLock(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c1, c2 := newClient(t, b), newClient(t, b)
		m1, m2 := c1.Mutex(name), c2.Mutex(name)
		if ok, err := m1.TryLock(ctx); !ok || err != nil {
			t.Fatalf("first TryLock = %v, %v; want true, nil", ok, err)
		}
		if ok, err := m2.TryLock(ctx); ok || err != nil {
			t.Fatalf("TryLock while held = %v, %v; want false, nil", ok, err)
		}
		// Without an owner a handle is not reentrant, like sync.Mutex.
		if ok, err := m1.TryLock(ctx); ok || err != nil {
			t.Fatalf("TryLock on the holding handle = %v, %v; want false, nil", ok, err)
		}
		if err := m1.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		if ok, err := m2.TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock after release = %v, %v; want true, nil", ok, err)
		}
		if err := m2.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		mustIs(t, m2.Unlock(ctx), dsync.ErrNotHeld, "second Unlock = %v, want ErrNotHeld")
	})
}

func TestMutexAnyGoroutineMayUnlockHandle(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		m := newClient(t, b).Mutex(redistest.Key(t))
		must(t, m.Lock(ctx))
		errc := make(chan error)
		go func() { errc <- m.Unlock(context.Background()) }()
		if err := <-errc; err != nil {
			t.Fatalf("Unlock from another goroutine = %v, want nil", err)
		}
		if ok, _ := m.TryLock(ctx); !ok {
			t.Fatal("lock still held after Unlock")
		}
	})
}

func TestMutexReentrantOwner(t *testing.T) {
	eachOwnerName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		m := c.Mutex(name)
		other := newClient(t, b).Mutex(name)
		for i := 0; i < 3; i++ {
			if err := m.Lock(ctx); err != nil {
				t.Fatalf("Lock %d: %v", i, err)
			}
		}
		rdb := b.NewClient(t)
		if n, _ := rdb.HGet(ctx, mutexKeys(name).Lock, dsync.OwnerToken(ctx)).Int(); n != 3 {
			t.Errorf("reentry count in Redis = %d, want 3", n)
		}
		// Another owner neither gets it nor may release it.
		octx := dsync.WithOwner(context.Background())
		if ok, _ := other.TryLock(octx); ok {
			t.Fatal("another owner took a held lock")
		}
		mustIs(t, other.Unlock(octx), dsync.ErrNotHeld, "Unlock by another owner = %v, want ErrNotHeld")
		// Nor may a caller without owner, even on the same handle.
		mustIs(t, m.Unlock(context.Background()), dsync.ErrNotHeld, "Unlock without owner = %v, want ErrNotHeld")
		unlockLevels(t, 3, gotIn(t, octx, other.TryLock, other.Unlock), func() error { return m.Unlock(ctx) }, "Unlock")
		mustIs(t, m.Unlock(ctx), dsync.ErrNotHeld, "fourth Unlock = %v, want ErrNotHeld")
	})
}

func TestMutexOwnerTokenAcrossProcesses(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		name := redistest.Key(t)
		a := newClient(t, b).Mutex(name)
		bm := newClient(t, b).Mutex(name) // another process
		ctxA := dsync.WithOwner(ctxT(t))
		must(t, a.Lock(ctxA))
		// The token crosses a process boundary (RPC metadata, say).
		ctxB := dsync.WithOwnerToken(ctxT(t), dsync.OwnerToken(ctxA))
		if ok, err := bm.TryLock(ctxB); !ok || err != nil {
			t.Fatalf("re-entry from another process = %v, %v; want true", ok, err)
		}
		la, _ := a.Lease(ctxA)
		lb, err := bm.Lease(ctxB)
		if err != nil {
			t.Fatal(err)
		}
		if la.Token() != lb.Token() {
			t.Errorf("fencing tokens differ on re-entry: %d vs %d", la.Token(), lb.Token())
		}
		must(t, bm.Unlock(ctxB))
		must(t, a.Unlock(ctxA))
		if ok, _ := bm.TryLock(context.Background()); !ok {
			t.Fatal("lock held after both unlocks")
		}
	})
}

func TestMutexWaiterWokenByRelease(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		holder := newClient(t, b).Mutex(name)
		waiter := newClient(t, b).Mutex(name)
		const rounds = 15
		var lat []time.Duration
		for i := 0; i < rounds; i++ {
			must(t, holder.Lock(ctx))
			got := make(chan time.Time, 1)
			go func() {
				if err := waiter.Lock(ctx); err != nil {
					t.Error(err)
				}
				got <- time.Now()
			}()
			time.Sleep(20 * time.Millisecond) // let the waiter block
			released := time.Now()
			must(t, holder.Unlock(ctx))
			lat = append(lat, (<-got).Sub(released))
			must(t, waiter.Unlock(ctx))
		}
		slices.Sort(lat)
		med := lat[len(lat)/2]
		t.Logf("handoff latency: median %v, max %v", med, lat[len(lat)-1])
		// The TTL is 30 s: only a notification explains a fast wake-up.
		if med > 15*time.Millisecond {
			t.Errorf("median handoff %v, want under 15ms", med)
		}
	})
}

func TestMutexNoStarvation(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const G = 4
		var ls []locker
		for g := 0; g < G; g++ {
			ls = append(ls, newClient(t, b).Mutex(name))
		}
		lo, hi, bad := contend(t, ctx, ls, 1500*time.Millisecond)
		t.Logf("acquisitions per goroutine: fewest %d, most %d", lo, hi)
		if bad != 0 {
			t.Errorf("two holders at once %d times", bad)
		}
		if lo == 0 || float64(lo) < 0.3*float64(hi) {
			t.Errorf("fewest/most = %d/%d, want ≥ 0.3 (no starvation)", lo, hi)
		}
	})
}

func TestMutexUnlockWithDoneContext(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		name := redistest.Key(t)
		m := newClient(t, b).Mutex(name)
		ctx, cancel := context.WithCancel(context.Background())
		must(t, m.Lock(ctx))
		cancel()
		// Unlock runs all the same. Its outcome comes with it when the
		// reply comes within a few ms (cleanupGrace); on a loaded machine
		// it may not, and Unlock returns ctx's error while the release
		// completes in the background: the lock is free either way.
		err := m.Unlock(ctx)
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("Unlock with a cancelled ctx = %v, want nil (or, past a few ms, context.Canceled)", err)
		}
		other := newClient(t, b).Mutex(name)
		if err == nil {
			if ok, _ := other.TryLock(context.Background()); !ok {
				t.Fatal("lock still held after Unlock returned nil")
			}
			return
		}
		waitFor(t, 5*time.Second, "the release in the background", func() bool {
			ok, _ := other.TryLock(context.Background())
			return ok
		})
	})
}

var _ redis.UniversalClient = (*redis.Client)(nil)

func TestMutexClientReentrancy(t *testing.T) {
	eachOwnerName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		counter := &redistest.Counter{}
		c, _ := hookedClient(t, b, counter, dsync.ClientReentrancy())
		m := c.Mutex(name)
		must(t, m.Lock(ctx))
		counter.Reset()
		for i := 0; i < 3; i++ {
			must(t, m.Lock(ctx))
		}
		for i := 0; i < 3; i++ {
			must(t, m.Unlock(ctx))
		}
		if n := counter.RoundTrips(); n != 0 {
			t.Errorf("re-entries and inner unlocks took %d round trips, want 0", n)
		}
		// Redis saw one Lock: its count is 1, under the owner token
		// qualified by this process.
		if v := holderField(t, b.NewClient(t), mutexKeys(name).Lock, dsync.OwnerToken(ctx)); v != "1" {
			t.Errorf("count in Redis = %q, want 1", v)
		}
		// The token in another process does not re-enter in this mode.
		other := dsync.New(b.NewClient(t), dsync.ClientReentrancy())
		defer other.Close()
		octx := dsync.WithOwnerToken(ctxT(t), dsync.OwnerToken(ctx))
		// Re-entry is per process: the carried token waits there like any
		// other owner.
		if ok, err := other.Mutex(name).TryLock(octx); ok || err != nil {
			t.Fatalf("TryLock with the token carried to another process = %v, %v; want false", ok, err)
		}
		must(t, m.Unlock(ctx))
		checkIs(t, m.Unlock(ctx), dsync.ErrNotHeld, "extra Unlock = %v, want ErrNotHeld")
	})
}

// holderField returns the value of the field of hash key that belongs to
// owner tok: tok itself (script reentrancy) or tok qualified by its Client
// (client reentrancy, "<tok>@<client>"); "" if none.
func holderField(t *testing.T, rdb redis.UniversalClient, key, tok string) string {
	t.Helper()
	m, err := rdb.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	for f, v := range m {
		if f == tok || strings.HasPrefix(f, tok+"@") {
			return v
		}
	}
	return ""
}
