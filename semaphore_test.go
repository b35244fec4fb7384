package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// semKeys are the keys of the semaphore called name.
func semKeys(name string) keys.Semaphore { return keys.ForSemaphore(dsync.DefaultPrefix, name) }

// assertNoSemKeys checks that a semaphore with nothing held or queued left
// only bookkeeping behind: see assertBookkeepingOnly.
func assertNoSemKeys(t *testing.T, b redistest.Backend, name string) {
	t.Helper()
	ks := semKeys(name)
	assertBookkeepingOnly(t, b, ks.Keys(), ks.Fence, ks.Calls)
}

// waitQueued waits until the semaphore's queue holds want waiters.
func waitQueued(t *testing.T, b redistest.Backend, name string, want int64) {
	t.Helper()
	rdb := b.NewClient(t)
	waitFor(t, 10*time.Second, fmt.Sprintf("queue length %d", want), func() bool {
		n, err := rdb.ZCard(context.Background(), semKeys(name).Queue).Result()
		must(t, err)
		return n == want
	})
}

func TestSemaphorePeakEqualsSize(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const size, clients, perClient, rounds = 4, 3, 3, 15
		var inside, peak, total atomic.Int64
		hammerClients(t, b, clients, perClient, rounds, func(c *dsync.Client, _ int) func() error {
			s := c.Semaphore(name, size) // one handle per goroutine
			return func() error {
				n := int64(1 + rand.IntN(2))
				if err := s.Acquire(ctx, n); err != nil {
					return fmt.Errorf("Acquire(%d): %w", n, err)
				}
				v := inside.Add(n)
				for p := peak.Load(); v > p && !peak.CompareAndSwap(p, v); p = peak.Load() {
				}
				total.Add(1)
				// Hold long enough for holdings to overlap in the test's
				// view, which lags the server's.
				time.Sleep(time.Duration(3000+rand.IntN(5000)) * time.Microsecond)
				inside.Add(-n)
				if err := s.Release(ctx, n); err != nil {
					return fmt.Errorf("Release(%d): %w", n, err)
				}
				return nil
			}
		})
		if got := peak.Load(); got != size {
			t.Errorf("peak permits held at once = %d, want %d", got, size)
		}
		if got, want := total.Load(), int64(clients*perClient*rounds); got != want {
			t.Errorf("acquisitions = %d, want %d", got, want)
		}
		assertNoSemKeys(t, b, name)
	})
}

func TestSemaphoreWeighted(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		x, y, z := c.Semaphore(name, 5), c.Semaphore(name, 5), newClient(t, b).Semaphore(name, 5)
		try := func(s *dsync.Semaphore, n int64, want bool) {
			t.Helper()
			if ok, err := s.TryAcquire(ctx, n); ok != want || err != nil {
				t.Fatalf("TryAcquire(%d) = %v, %v; want %v, nil", n, ok, err, want)
			}
		}
		try(x, 3, true)
		try(y, 3, false)
		try(y, 2, true)
		try(z, 1, false)
		must(t, x.Release(ctx, 1))
		try(z, 2, false)
		try(z, 1, true)
		if n, _ := b.NewClient(t).HGet(ctx, semKeys(name).State, ":used").Int(); n != 5 {
			t.Errorf("permits used in Redis = %d, want 5", n)
		}
		for _, r := range []struct {
			s *dsync.Semaphore
			n int64
		}{{x, 2}, {y, 2}, {z, 1}} {
			if err := r.s.Release(ctx, r.n); err != nil {
				t.Fatalf("Release(%d): %v", r.n, err)
			}
		}
		try(z, 5, true)
		must(t, z.Release(ctx, 5))
		assertNoSemKeys(t, b, name)
	})
}

func TestSemaphoreHandleIsOneHolder(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		s := newClient(t, b).Semaphore(name, 4)
		if _, err := s.Lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
			t.Fatalf("Lease before Acquire = %v, want ErrNotHeld", err)
		}
		mustIs(t, s.Release(ctx, 1), dsync.ErrNotHeld, "Release before Acquire = %v, want ErrNotHeld")
		// Goroutines sharing the handle add to one holding, as with a
		// shared semaphore.Weighted, and any of them may release.
		inParallel(t, 3, func() error { return s.Acquire(ctx, 1) })
		l, err := s.Lease(ctx)
		if err != nil || l.Token() == 0 {
			t.Fatalf("Lease = %v, %v; want a token", l, err)
		}
		holders, _ := b.NewClient(t).ZCard(ctx, semKeys(name).Holders).Result()
		if holders != 1 {
			t.Errorf("holders in Redis = %d, want 1", holders)
		}
		if err := s.Release(ctx, 4); !errors.Is(err, dsync.ErrNotHeld) || !errors.Is(err, dsync.ErrInvalid) {
			t.Errorf("Release(4) of 3 held = %v, want ErrNotHeld and ErrInvalid", err)
		}
		errc := make(chan error)
		go func() { errc <- s.Release(context.Background(), 2) }()
		if err := <-errc; err != nil {
			t.Fatalf("Release from another goroutine: %v", err)
		}
		if l2, _ := s.Lease(ctx); l2 == nil || l2.Token() != l.Token() {
			t.Errorf("Lease after a partial release = %v, want the same token %d", l2, l.Token())
		}
		must(t, s.Release(ctx, 1))
		waitDone(t, l, 5*time.Second, "after the last permit was released")
		if l.Err() != nil {
			t.Errorf("Lease.Err after release = %v, want nil", l.Err())
		}
		if _, err := s.Lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
			t.Errorf("Lease after release = %v, want ErrNotHeld", err)
		}
		// A fresh holding gets a larger fencing token.
		must(t, s.Acquire(ctx, 1))
		if l3, _ := s.Lease(ctx); l3 == nil || l3.Token() <= l.Token() {
			t.Errorf("fresh holding token %v, want > %d", l3, l.Token())
		}
		must(t, s.Release(ctx, 1))
		assertNoSemKeys(t, b, name)
	})
}

func TestSemaphoreOwner(t *testing.T) {
	eachOwnerName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		s := newClient(t, b).Semaphore(name, 4)
		other := newClient(t, b).Semaphore(name, 4) // another process
		for i := 0; i < 2; i++ {
			must(t, s.Acquire(ctx, 1))
		}
		// The owner crosses a process boundary and adds to its holding.
		ctxB := dsync.WithOwnerToken(ctxT(t), dsync.OwnerToken(ctx))
		if ok, err := other.TryAcquire(ctxB, 1); !ok || err != nil {
			t.Fatalf("TryAcquire by the same owner elsewhere = %v, %v", ok, err)
		}
		rdb := b.NewClient(t)
		if n, _ := rdb.HGet(ctx, semKeys(name).State, dsync.OwnerToken(ctx)).Int(); n != 3 {
			t.Errorf("owner's permits in Redis = %d, want 3", n)
		}
		la, _ := s.Lease(ctx)
		lb, err := other.Lease(ctxB)
		if err != nil || la == nil || la.Token() != lb.Token() {
			t.Fatalf("leases of one holding: %v, %v, %v", la, lb, err)
		}
		// Neither another owner nor the handle without owner may release.
		checkIs(t, s.Release(dsync.WithOwner(ctx), 1), dsync.ErrNotHeld, "Release by another owner = %v, want ErrNotHeld")
		checkIs(t, s.Release(context.Background(), 1), dsync.ErrNotHeld, "Release without owner = %v, want ErrNotHeld")
		if ok, _ := other.TryAcquire(dsync.WithOwner(ctx), 2); ok {
			t.Fatal("2 permits free with 3 of 4 held")
		}
		must(t, other.Release(ctxB, 1))
		must(t, s.Release(ctx, 2))
		mustIs(t, s.Release(ctx, 1), dsync.ErrNotHeld, "Release after all = %v, want ErrNotHeld")
		waitDone(t, la, 5*time.Second, "after release")
		assertNoSemKeys(t, b, name)
	})
}

// TestSemaphoreFIFO: a large request first in line is served before later
// small ones that would fit, and waiters are served in arrival order.
func TestSemaphoreFIFO(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		holder := newClient(t, b).Semaphore(name, 4)
		must(t, holder.Acquire(ctx, 4))
		type served struct {
			who   int
			token uint64
		}
		got := make(chan served, 8)
		want := []int64{3, 1, 1, 2} // the large one first
		var wg sync.WaitGroup
		handles := make([]*dsync.Semaphore, len(want))
		for i, n := range want {
			handles[i] = newClient(t, b).Semaphore(name, 4)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := handles[i].Acquire(ctx, n); err != nil {
					t.Error(err)
					return
				}
				l, err := handles[i].Lease(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				got <- served{i, l.Token()}
			}()
			waitQueued(t, b, name, int64(i+1)) // arrival order is i
		}
		expect := func(whos ...int) {
			t.Helper()
			for _, w := range whos {
				select {
				case s := <-got:
					if s.who != w {
						t.Fatalf("served waiter %d, want %d", s.who, w)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("waiter %d not served", w)
				}
			}
			select {
			case s := <-got:
				t.Fatalf("waiter %d served too early", s.who)
			case <-time.After(100 * time.Millisecond):
			}
		}
		// One permit free: the small waiters behind the large one fit but
		// must not pass it.
		must(t, holder.Release(ctx, 1))
		expect()
		if ok, _ := newClient(t, b).Semaphore(name, 4).TryAcquire(ctx, 1); ok {
			t.Fatal("TryAcquire passed the queue")
		}
		must(t, holder.Release(ctx, 2))
		expect(0)
		must(t, holder.Release(ctx, 1))
		expect(1)
		must(t, handles[0].Release(ctx, 3))
		// 3 free: waiter 2 (1 permit) and waiter 3 (2 permits) in one go.
		var order []served
		for range 2 {
			select {
			case s := <-got:
				order = append(order, s)
			case <-time.After(10 * time.Second):
				t.Fatal("waiters 2 and 3 not served")
			}
		}
		slices.SortFunc(order, func(a, b served) int { return int(a.who - b.who) })
		if order[0].who != 2 || order[1].who != 3 || order[0].token >= order[1].token {
			t.Errorf("served %v, want waiter 2 then 3 (increasing tokens)", order)
		}
		wg.Wait()
		for i, n := range want[1:] {
			must(t, handles[i+1].Release(ctx, n))
		}
		assertNoSemKeys(t, b, name)
	})
}

func TestSemaphoreDeadHolderPermitsReturn(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const ttl = 400 * time.Millisecond
		dead := dsync.New(b.NewClient(t), dsync.TTL(ttl))
		must(t, dead.Semaphore(name, 4).Acquire(ctx, 3))
		dead.Close() // the process dies: nobody renews or releases
		s := newClient(t, b).Semaphore(name, 4)
		if ok, _ := s.TryAcquire(ctx, 2); ok {
			t.Fatal("dead holder's permits free before its TTL")
		}
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- s.Acquire(ctx, 4) }()
		waitQueued(t, b, name, 1)
		b.Advance(ttl + 50*time.Millisecond)
		recvNil(t, done, 10*time.Second, "dead holder's permits never came back")
		t.Logf("served after %v", time.Since(start))
		must(t, s.Release(ctx, 4))
		assertNoSemKeys(t, b, name)
	})
}

func TestSemaphoreRenewalKeepsPermits(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		// Renewed every 500 ms: a renewal may come up to 1 s late on a
		// loaded machine before the lease runs out.
		const ttl = 1500 * time.Millisecond
		s := newClient(t, b, dsync.TTL(ttl)).Semaphore(name, 2)
		must(t, s.Acquire(ctx, 2))
		time.Sleep(2 * ttl) // several renewals; TIME follows the wall clock
		if ok, _ := newClient(t, b).Semaphore(name, 2).TryAcquire(ctx, 1); ok {
			t.Fatal("permits free while renewed")
		}
		l, _ := s.Lease(ctx)
		if l == nil || l.Err() != nil {
			t.Fatalf("lease %v lost", l)
		}
		must(t, s.Release(ctx, 2))
	})
}

func TestSemaphoreWaiterGivingUpUnblocksOthers(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		holder := newClient(t, b).Semaphore(name, 2)
		must(t, holder.Acquire(ctx, 1))
		bigCtx, giveUp := context.WithCancel(ctx)
		big := make(chan error, 1)
		go func() { big <- newClient(t, b).Semaphore(name, 2).Acquire(bigCtx, 2) }()
		waitQueued(t, b, name, 1)
		small := newClient(t, b).Semaphore(name, 2)
		done := make(chan error, 1)
		go func() { done <- small.Acquire(ctx, 1) }()
		waitQueued(t, b, name, 2)
		select {
		case <-done:
			t.Fatal("small waiter passed the large one")
		case <-time.After(50 * time.Millisecond):
		}
		giveUp()
		mustIs(t, <-big, context.Canceled, "Acquire of the waiter that gave up = %v, want Canceled")
		// The TTL is 30 s: only the cleanup's hand-over explains this.
		recvNil(t, done, 5*time.Second, "waiter behind one that gave up not served")
		must(t, small.Release(ctx, 1))
		must(t, holder.Release(ctx, 1))
		assertNoSemKeys(t, b, name)
	})
}

func TestSemaphoreWokenByRelease(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		holder := newClient(t, b).Semaphore(name, 1)
		waiter := newClient(t, b).Semaphore(name, 1)
		var lat []time.Duration
		for i := 0; i < 10; i++ {
			must(t, holder.Acquire(ctx, 1))
			got := make(chan time.Time, 1)
			go func() {
				if err := waiter.Acquire(ctx, 1); err != nil {
					t.Error(err)
				}
				got <- time.Now()
			}()
			waitQueued(t, b, name, 1)
			released := time.Now()
			must(t, holder.Release(ctx, 1))
			lat = append(lat, (<-got).Sub(released))
			must(t, waiter.Release(ctx, 1))
		}
		slices.Sort(lat)
		t.Logf("hand-over latency: median %v, max %v", lat[len(lat)/2], lat[len(lat)-1])
		if med := lat[len(lat)/2]; med > 50*time.Millisecond {
			t.Errorf("median hand-over %v, want under 50ms", med)
		}
	})
}

// A Release whose reply is lost releases once; the caller is told the
// outcome is unknown. (Lost replies of Acquire and TryAcquire: see
// TestContract.)
func TestSemaphoreLostReleaseReply(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		faults := &redistest.Faults{}
		c, _ := hookedClient(t, b, faults)
		s := c.Semaphore(name, 2)
		other := newClient(t, b).Semaphore(name, 2)
		must(t, other.Acquire(ctx, 2))
		// This Release also loads the script: the reply lost below is
		// the script's, not a NOSCRIPT's.
		must(t, other.Release(ctx, 1))
		if ok, _ := s.TryAcquire(ctx, 1); !ok {
			t.Fatal("TryAcquire(1) with 1 free failed")
		}
		faults.DropReplyNext(1, context.DeadlineExceeded)
		mustIs(t, s.Release(ctx, 1), context.DeadlineExceeded, "Release = %v, want the injected error")
		must(t, other.Release(ctx, 1))
		assertNoSemKeys(t, b, name)
	})
}

// TestSemaphoreScriptsIdempotent runs the scripts twice with one call id,
// as go-redis does when it retries after a read timeout.
func TestSemaphoreScriptsIdempotent(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		keys := semKeys(name).Keys()
		acquire := func(tok, id string, n int64) []int64 {
			t.Helper()
			r, err := lua.Script("semaphore_acquire").Run(ctx, rdb, keys, tok, n, 4, 30000, id, "1", 86400000, keys[0], "secret", boundNow(t, ctx, rdb, 20*time.Second)).Int64Slice()
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		// The release names the holding it ends by its fencing token, as
		// Release does; 0: the caller does not know it.
		release := func(tok, id string, n, fence int64) []int64 {
			t.Helper()
			name := ""
			if fence > 0 {
				name = strconv.FormatInt(fence, 10)
			}
			r, err := lua.Script("semaphore_release").Run(ctx, rdb, keys, tok, n, 4, id, 86400000, keys[0], name).Int64Slice()
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		count := func(tok string) int {
			n, _ := rdb.HGet(ctx, keys[0], tok).Int()
			return n
		}
		// The repeat answers with the same token, as a grant this call had
		// already (code 2).
		a1 := acquire("a", "call1", 2)
		a2 := acquire("a", "call1", 2)
		if a1[0] != 1 || a2[0] != 2 || a1[1] != a2[1] || count("a") != 2 {
			t.Fatalf("acquire twice: %v then %v, count %d; want one grant of 2", a1, a2, count("a"))
		}
		acquire("a", "call2", 1)
		r1 := release("a", "call3", 1, 0)
		r2 := release("a", "call3", 1, 0)
		if !slices.Equal(r1, r2) || r1[1] != 2 || count("a") != 2 {
			t.Fatalf("release twice: %v then %v, count %d; want one release", r1, r2, count("a"))
		}
		e1 := release("a", "call4", 2, a1[1])
		e2 := release("a", "call4", 2, a1[1])
		if !slices.Equal(e1, e2) || e1[1] != 0 || e1[2] != a1[1] {
			t.Fatalf("final release twice: %v then %v; want {1 0 %d} both times", e1, e2, a1[1])
		}
		// An abandoned call that arrives late changes nothing.
		if _, err := lua.Script("semaphore_abandon").Run(ctx, rdb, keys, "b", 1, "late", 86400000, keys[0]).Result(); err != nil {
			t.Fatal(err)
		}
		if r := acquire("b", "late", 1); r[0] != 0 || count("b") != 0 {
			t.Fatalf("late attempt of an abandoned call = %v, count %d; want refused, 0", r, count("b"))
		}
		assertNoSemKeys(t, b, name)
	})
}

func TestSemaphoreSizeMismatch(t *testing.T) {
	eachOwnerName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		four := newClient(t, b).Semaphore(name, 4)
		five := newClient(t, b).Semaphore(name, 5)
		must(t, four.Acquire(ctx, 1))
		checkIs(t, five.Acquire(ctx, 1), dsync.ErrSizeMismatch, "Acquire with another size = %v, want ErrSizeMismatch")
		if _, err := five.TryAcquire(context.Background(), 1); !errors.Is(err, dsync.ErrSizeMismatch) {
			t.Errorf("TryAcquire with another size = %v, want ErrSizeMismatch", err)
		}
		checkIs(t, five.Release(ctx, 1), dsync.ErrSizeMismatch, "Release with another size = %v, want ErrSizeMismatch")
		if n, _ := b.NewClient(t).HGet(ctx, semKeys(name).State, dsync.OwnerToken(ctx)).Int(); n != 1 {
			t.Errorf("permits held after mismatches = %d, want 1", n)
		}
		must(t, four.Release(ctx, 1))
		// Nothing in force any more: the new size takes over.
		if ok, err := five.TryAcquire(ctx, 5); !ok || err != nil {
			t.Fatalf("TryAcquire(5) once size 4 is gone = %v, %v", ok, err)
		}
		must(t, five.Release(ctx, 5))
	})
}

// An Acquire whose reply was lost is undone by its abandon also when more
// Acquires of the same holder than the holding's list of recent calls
// keeps (32) took permits before the abandon arrived: the abandon finds
// the call in the call ids zset, gives its permit back once, and the
// permits the caller was told it holds are all there are.
func TestSemaphoreAbandonAfterManyAcquiresOfTheHolder(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const size, others = 100, 40
		attempt := scriptFaults("semaphore_acquire")
		gate := &unlockGate{sha: lua.Script("semaphore_abandon").Hash()}
		c, rdb := hookedClient(t, b, attempt)
		rdb.AddHook(gate)
		rec := &redistest.Recorder{}
		rdb.AddHook(rec)
		s := c.Semaphore(name, size)
		must(t, s.Acquire(ctx, 1)) // a holding; the scripts loaded
		gate.close()
		attempt.DropReplyNext(1, errors.New("i/o timeout"))
		// The call waits for its abandon while its ctx lives.
		lost := async(func() error { return s.Acquire(ctx, 1) })
		waitFor(t, 10*time.Second, "the abandon, held at the gate", func() bool { return gate.held.Load() == 1 })
		for i := 0; i < others; i++ {
			if ok, err := s.TryAcquire(ctx, 1); !ok || err != nil {
				t.Fatalf("TryAcquire %d: %v, %v", i, ok, err)
			}
		}
		gate.open()
		select {
		case err := <-lost:
			if err == nil {
				t.Fatal("the Acquire whose reply was lost returned nil")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the Acquire whose reply was lost did not return")
		}
		dsync.WaitCleanups(c)
		admin := b.NewClient(t)
		used, err := admin.HGet(ctx, semKeys(name).State, ":used").Int64()
		must(t, err)
		if used != 1+others {
			t.Fatalf("permits held after the abandon: %d, want %d (the lost call's permit given back)", used, 1+others)
		}
		// A copy of the abandon, arriving late, gives nothing back again.
		sha := lua.Script("semaphore_abandon").Hash()
		copies := 0
		for _, a := range rec.All() {
			if a[1] == sha {
				must(t, rdb.Do(ctx, a...).Err())
				copies++
			}
		}
		if copies == 0 {
			t.Fatal("no abandon recorded")
		}
		used, err = admin.HGet(ctx, semKeys(name).State, ":used").Int64()
		must(t, err)
		if used != 1+others {
			t.Fatalf("permits held after a late copy of the abandon: %d, want %d", used, 1+others)
		}
		must(t, s.Release(ctx, 1+others))
		if n, err := admin.Exists(ctx, semKeys(name).State, semKeys(name).Holders).Result(); err != nil || n != 0 {
			t.Errorf("keys of the semaphore after every permit was released: %d, %v; want none", n, err)
		}
		if _, err := s.Lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
			t.Errorf("Lease after every permit was released: %v, want ErrNotHeld", err)
		}
	})
}
