package dsync_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A re-entry through a handle with a shorter TTL never moves the hold's
// expiry earlier (Mutex and RWMutex write).
func TestReentryNeverShortensExpiry(t *testing.T) {
	eachOwnerName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		rdb := b.NewClient(t)
		check := func(what, key string) {
			t.Helper()
			if d, err := rdb.PTTL(ctx, key).Result(); err != nil || d < 20*time.Second {
				t.Fatalf("%s: PTTL after a re-entry with TTL 200ms = %v, %v; want the 30s hold's", what, d, err)
			}
		}
		long, short := c.Mutex(name, dsync.TTL(30*time.Second)), c.Mutex(name, dsync.TTL(200*time.Millisecond))
		must(t, long.Lock(ctx))
		must(t, short.Lock(ctx))
		check("Mutex", mutexKeys(name).Lock)
		rwLong, rwShort := c.RWMutex(name, dsync.TTL(30*time.Second)), c.RWMutex(name, dsync.TTL(200*time.Millisecond))
		must(t, rwLong.Lock(ctx))
		must(t, rwShort.Lock(ctx))
		check("RWMutex", rwk(name).Writer)
		for _, f := range []func(context.Context) error{short.Unlock, long.Unlock, rwShort.Unlock, rwLong.Unlock} {
			must(t, f(ctx))
		}
	})
}

// Nor does the renewal of a re-entry from another process with a shorter
// TTL (the owner token carried there): its renewer extends the hold at its
// own TTL, and once it unlocks, the first holder's hold must still last its
// own lease, not the re-entry's (Mutex and RWMutex write).
func TestReentryRenewalNeverShortensExpiry(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		own := dsync.WithOwner(ctx)
		there := dsync.WithOwnerToken(ctx, dsync.OwnerToken(own))
		c1 := newClient(t, b, dsync.TTL(30*time.Second))
		rec := &redistest.Recorder{}
		rdb2 := b.NewClient(t)
		rdb2.AddHook(rec)
		c2 := dsync.New(rdb2, dsync.TTL(150*time.Millisecond))
		t.Cleanup(func() { c2.Close() })
		rdb := b.NewClient(t)
		for _, tc := range []struct {
			what    string
			first   locker
			reentry locker
			key     string
		}{
			{"Mutex", c1.Mutex(name), c2.Mutex(name), mutexKeys(name).Lock},
			{"RWMutex", c1.RWMutex(name + "rw"), c2.RWMutex(name + "rw"), rwk(name + "rw").Writer},
		} {
			must(t, tc.first.Lock(own))
			must(t, tc.reentry.Lock(there))
			// Wait for two renewals by the re-entering process.
			rec.Reset()
			deadline := time.Now().Add(20 * time.Second)
			for len(rec.All()) < 2 {
				if time.Now().After(deadline) {
					t.Fatalf("%s: the re-entry's hold was not renewed twice in 20s", tc.what)
				}
				time.Sleep(10 * time.Millisecond)
			}
			must(t, tc.reentry.Unlock(there))
			if d, err := rdb.PTTL(ctx, tc.key).Result(); err != nil || d < 20*time.Second {
				t.Fatalf("%s: PTTL after a re-entry with TTL 150ms was renewed and unlocked = %v, %v; want the 30s hold's", tc.what, d, err)
			}
			must(t, tc.first.Unlock(own))
		}
	})
}

// A Mutex handle without an owner stays locked from Lock to Unlock also when
// its hold was lost: a second Lock through it waits, the Unlock reports the
// loss and leaves the new holder's hold alone, and the lost Lease keeps
// reporting ErrLeaseLost.
func TestHandleStaysLockedAfterLeaseLoss(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		m := newClient(t, b).Mutex(name)
		l := lockLease(t, ctx, m)
		must(t, b.NewClient(t).Del(ctx, mutexKeys(name).Lock).Err())
		// The handle was not unlocked: a second Lock through it waits,
		// although the name is free in Redis.
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := m.Lock(wctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("second Lock through the handle = %v, want DeadlineExceeded", err)
		}
		other := newClient(t, b).Mutex(name)
		must(t, other.Lock(ctx))
		mustIs(t, m.Unlock(ctx), dsync.ErrLeaseLost, "Unlock of the lost hold = %v, want ErrLeaseLost")
		mustIs(t, l.Err(), dsync.ErrLeaseLost, "lost Lease Err = %v, want ErrLeaseLost")
		if ok, err := newClient(t, b).Mutex(name).TryLock(ctx); ok || err != nil {
			t.Fatalf("TryLock while the other holder holds = %v, %v; the lost hold's Unlock released it", ok, err)
		}
		if err := other.Unlock(ctx); err != nil {
			t.Fatalf("the other holder's Unlock = %v", err)
		}
		must(t, m.Lock(ctx))
		mustIs(t, l.Err(), dsync.ErrLeaseLost, "lost Lease Err after the handle locked again = %v, want ErrLeaseLost")
		must(t, m.Unlock(ctx))
	})
}

// A handle without an owner stays locked after its Lease reported the
// loss, until its Unlock: Lock and TryLock through it wait and fail, also
// once the holder knows the hold is gone (Mutex and RWMutex write).
func TestHandleStaysLockedAfterLossReported(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b, dsync.TTL(time.Second))
		rdb := b.NewClient(t)
		m := c.Mutex(name + "-m")
		rw := c.RWMutex(name + "-rw")
		cases := []struct {
			what   string
			lock   func(context.Context) error
			try    func(context.Context) (bool, error)
			lease  func(context.Context) (*dsync.Lease, error)
			key    string
			unlock func(context.Context) error
		}{
			{"Mutex", m.Lock, m.TryLock, m.Lease, mutexKeys(name + "-m").Lock, m.Unlock},
			{"RWMutex", rw.Lock, rw.TryLock, rw.Lease, rwk(name + "-rw").Writer, rw.Unlock},
		}
		for _, tc := range cases {
			must(t, tc.lock(ctx))
			l, err := tc.lease(ctx)
			must(t, err)
			must(t, rdb.Del(ctx, tc.key).Err())
			select {
			case <-l.Done():
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: the loss was not reported within 10s", tc.what)
			}
			if err := l.Err(); !errors.Is(err, dsync.ErrLeaseLost) {
				t.Fatalf("%s: Lease Err = %v, want ErrLeaseLost", tc.what, err)
			}
			if ok, err := tc.try(ctx); ok || err != nil {
				t.Fatalf("%s: TryLock through the handle after the reported loss = %v, %v; want false", tc.what, ok, err)
			}
			wctx, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
			err = tc.lock(wctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s: Lock through the handle after the reported loss = %v, want DeadlineExceeded", tc.what, err)
			}
			if err := tc.unlock(ctx); !errors.Is(err, dsync.ErrLeaseLost) {
				t.Fatalf("%s: Unlock of the lost hold = %v, want ErrLeaseLost", tc.what, err)
			}
			must(t, tc.lock(ctx))
			must(t, tc.unlock(ctx))
		}
	})
}

// An owner whose hold was lost (its keys deleted) and who then takes the
// name afresh (a new fencing token) is told of the loss: the first hold's
// Lease reports ErrLeaseLost, not a release, since nobody released it. A
// goroutine of the owner that still relies on the first hold learns that
// it is gone.
func TestOwnerHoldReplacedAfterLossIsLost(t *testing.T) {
	eachOwnerName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		rdb := b.NewClient(t)
		cases := []struct {
			what string
			kind holdKind
			name string
			keys []string // the keys that, deleted, lose the hold
		}{
			{"Mutex", mutexHold, name + "-m", []string{mutexKeys(name + "-m").Lock}},
			{"RWMutex", writeHold, name + "-rw", []string{rwk(name + "-rw").Writer}},
			{"Semaphore", semHold(2, 1), name + "-s", []string{semKeys(name + "-s").State, semKeys(name + "-s").Holders}},
		}
		for _, tc := range cases {
			h := tc.kind(c, tc.name)
			first := lockLeaseOf(t, ctx, h, tc.what)
			must(t, rdb.Del(ctx, tc.keys...).Err())
			// Another goroutine of the owner takes the name afresh.
			second := lockLeaseOf(t, ctx, h, tc.what+": lock after the loss")
			if second.Token() <= first.Token() {
				t.Fatalf("%s: token %d after the loss, want above %d (a fresh hold)", tc.what, second.Token(), first.Token())
			}
			if err := first.Err(); !errors.Is(err, dsync.ErrLeaseLost) {
				t.Fatalf("%s: the lost hold's Lease Err = %v, want ErrLeaseLost", tc.what, err)
			}
			if err := second.Err(); err != nil {
				t.Fatalf("%s: the new hold's Lease Err = %v", tc.what, err)
			}
			if err := h.unlock(ctx); err != nil {
				t.Fatalf("%s: unlock of the new hold: %v", tc.what, err)
			}
		}
	})
}

// The goroutines acting for one owner share its levels (Mutex.Unlock):
// the two levels of a lost hold go with it, and once the owner holds
// again, the Unlock a goroutine meant for its level of the lost hold ends
// the new hold, whose Lease then ends released, not lost. The name is then
// free for another owner, and a further Unlock finds nothing held.
func TestOwnerLevelsOfALostHoldAreGone(t *testing.T) {
	eachOwnerName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		m := c.Mutex(name)
		must(t, m.Lock(ctx)) // goroutine 1
		must(t, m.Lock(ctx)) // goroutine 2, a re-entry
		first, err := m.Lease(ctx)
		must(t, err)
		must(t, b.NewClient(t).Del(ctx, mutexKeys(name).Lock).Err())
		must(t, m.Lock(ctx)) // goroutine 1 again, after the loss
		fresh, err := m.Lease(ctx)
		must(t, err)
		mustIs(t, first.Err(), dsync.ErrLeaseLost, "the lost hold's Lease Err = %v, want ErrLeaseLost")
		if err := m.Unlock(ctx); err != nil { // goroutine 2, for its level of the lost hold
			t.Fatalf("Unlock after the owner holds again = %v, want nil (it ends a level of the new hold)", err)
		}
		select {
		case <-fresh.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the new hold's Lease did not end within 10s of its release")
		}
		if err := fresh.Err(); errors.Is(err, dsync.ErrLeaseLost) {
			t.Fatalf("the new hold's Lease Err = %v, want a release, not a loss", err)
		}
		other := newClient(t, b).Mutex(name)
		if ok, err := other.TryLock(dsync.WithOwner(ctxT(t))); err != nil || !ok {
			t.Fatalf("another owner's TryLock after the release = %v, %v; want true", ok, err)
		}
		mustIs(t, m.Unlock(ctx), dsync.ErrNotHeld, "a further Unlock = %v, want ErrNotHeld")
	})
}

// A Semaphore handle without an owner whose holding was lost still owes
// its permits: a Release of them reports the loss and leaves the holding a
// later Acquire through the handle took alone, so the semaphore never has
// more holders than permits.
func TestSemaphoreHandleOwesLostPermits(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		s := newClient(t, b).Semaphore(name, 1)
		other := newClient(t, b).Semaphore(name, 1)
		if err := s.Acquire(ctx, 1); err != nil { // G1
			t.Fatal(err)
		}
		lost, err := s.Lease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		k := semKeys(name)
		must(t, b.NewClient(t).Del(ctx, k.State, k.Holders).Err())
		if err := s.Acquire(ctx, 1); err != nil { // G2, through the same handle
			t.Fatal(err)
		}
		mustIs(t, lost.Err(), dsync.ErrLeaseLost, "the first holding's Lease Err = %v, want ErrLeaseLost")
		// G1 releases its permit: the loss is reported, G2's permit stays.
		mustIs(t, s.Release(ctx, 1), dsync.ErrLeaseLost, "Release of the lost permit = %v, want ErrLeaseLost")
		if ok, err := other.TryAcquire(ctx, 1); err != nil || ok {
			t.Fatalf("another process's TryAcquire while G2 holds = %v, %v; want false", ok, err)
		}
		l, err := s.Lease(ctx)
		if err != nil || l.Err() != nil {
			t.Fatalf("G2's Lease = %v, %v", l, err)
		}
		if err := s.Release(ctx, 1); err != nil { // G2
			t.Fatalf("G2's Release = %v", err)
		}
		if ok, err := other.TryAcquire(ctx, 1); err != nil || !ok {
			t.Fatalf("TryAcquire after both Releases = %v, %v; want true", ok, err)
		}
		must(t, other.Release(ctx, 1))
		mustIs(t, s.Release(ctx, 1), dsync.ErrNotHeld, "a third Release = %v, want ErrNotHeld")
	})
}

// Goroutines sharing a Semaphore handle without an owner, with no loss:
// one's Release may end the holding while another's Acquire starts a new
// one, and the replies may come back in either order. No permit is taken
// for a lost one: every Release succeeds and nothing is left held.
func TestSemaphoreHandleSharedWithoutLoss(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		s := newClient(t, b).Semaphore(name, 2)
		const goroutines, rounds = 3, 60
		errs := make(chan error, goroutines*rounds)
		var wg sync.WaitGroup
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					if err := s.Acquire(ctx, 1); err != nil {
						errs <- err
						return
					}
					if err := s.Release(ctx, 1); err != nil {
						errs <- fmt.Errorf("Release: %w", err)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		other := newClient(t, b).Semaphore(name, 2)
		if ok, err := other.TryAcquire(ctx, 2); err != nil || !ok {
			t.Fatalf("TryAcquire(2) after every Release = %v, %v; want true", ok, err)
		}
		must(t, other.Release(ctx, 2))
	})
}

// A PUBLISH that names a waiting call, without the proof only the script
// has, wakes the waiter but grants it nothing.
func TestForgedHandoverGrantsNothing(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		holder := newClient(t, b).Mutex(name)
		hl := lockLease(t, ctx, holder)
		waiter := newClient(t, b).Mutex(name)
		done := make(chan error, 1)
		go func() { done <- waiter.Lock(ctx) }()
		// The waiter's queue place: waiter token -> "<deadline> <ttl>
		// <call id> ...".
		var tok, cid string
		waitFor(t, 5*time.Second, "the waiter's queue place", func() bool {
			m, _ := rdb.HGetAll(ctx, mutexKeys(name).QueueData).Result()
			for f, v := range m {
				if fs := strings.Fields(v); len(fs) >= 3 {
					tok, cid = f, fs[2]
					return true
				}
			}
			return false
		})
		for _, p := range []string{
			tok + " 424242",
			cid + " " + sha1hex(tok) + " 424242 " + sha1hex("guess 424242"),
			cid + " " + sha1hex(tok) + " 9223372036854775808 x",
			cid + " 424242",
		} {
			must(t, rdb.Publish(ctx, mutexKeys(name).Channel(), p).Err())
		}
		select {
		case err := <-done:
			t.Fatalf("Lock returned %v after forged hand-overs while another holds", err)
		case <-time.After(300 * time.Millisecond):
		}
		must(t, holder.Unlock(ctx))
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		l, err := waiter.Lease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= hl.Token() || l.Token() == 424242 {
			t.Fatalf("token after the real hand-over = %d, want above the holder's %d", l.Token(), hl.Token())
		}
		must(t, waiter.Unlock(ctx))
	})
}

// Two goroutines of one owner that wait for a Mutex both get in when it is
// released, as two levels of one hold: the first Unlock leaves it held.
func TestOwnerWaitingInTwoGoroutinesCountsTwice(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		holder := newClient(t, b).Mutex(name)
		must(t, holder.Lock(ctx))
		octx := dsync.WithOwner(ctx)
		m := newClient(t, b).Mutex(name)
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- m.Lock(octx)
			}()
		}
		rdb := b.NewClient(t)
		waitFor(t, 5*time.Second, "a queue place", func() bool {
			n, _ := rdb.Exists(ctx, mutexKeys(name).QueueData).Result()
			return n == 1
		})
		must(t, holder.Unlock(ctx))
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if v := holderField(t, rdb, mutexKeys(name).Lock, dsync.OwnerToken(octx)); v != "2" {
			t.Fatalf("count in Redis = %q, want 2", v)
		}
		must(t, m.Unlock(octx))
		if ok, err := newClient(t, b).Mutex(name).TryLock(ctx); ok || err != nil {
			t.Fatalf("TryLock by another after one of two Unlocks = %v, %v; want false", ok, err)
		}
		must(t, m.Unlock(octx))
		if ok, err := newClient(t, b).Mutex(name).TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock by another after both Unlocks = %v, %v; want true", ok, err)
		}
	})
}

// unlockGate holds back the calls of one unlock script (sha) made through a
// go-redis client while it is shut; others pass.
type unlockGate struct {
	sha  string
	mu   sync.Mutex
	shut chan struct{} // nil while open
	held atomic.Int64
	// Scripts other than sha that the server answered (but NOSCRIPT).
	others atomic.Int64
}

func (g *unlockGate) close() {
	g.mu.Lock()
	g.shut = make(chan struct{})
	g.mu.Unlock()
}

func (g *unlockGate) open() {
	g.mu.Lock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
	g.mu.Unlock()
}

func (g *unlockGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *unlockGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 1 && cmd.Name() == "evalsha" && fmt.Sprint(args[1]) != g.sha {
			err := next(ctx, cmd)
			if err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
				g.others.Add(1)
			}
			return err
		}
		if len(args) > 1 && fmt.Sprint(args[1]) == g.sha {
			g.mu.Lock()
			shut := g.shut
			g.mu.Unlock()
			if shut != nil {
				g.held.Add(1)
				select {
				case <-shut:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		return next(ctx, cmd)
	}
}

func (g *unlockGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// With client reentrancy, an owner's lock call (A) that waits is given the
// hold (handed over, or admitted as a reader by a writer's unlock) but its
// ctx ends before it learns of it: its clean-up, left to the background,
// is to release that hold. If the owner locks again on the same Client (B)
// before the clean-up reaches the server, B finds the owner holding in
// Redis and takes that hold as its own (the count there stays one); A's
// clean-up must then leave it alone, or B returns holding nothing while
// another process gets in.
func TestClientReentrancyAbandonLeavesAdoptedHold(t *testing.T) {
	cases := []struct {
		name, script string
		// first: the other process's hold that A waits for; mine: A and
		// B; other: another process's attempt while B holds.
		first, mine, other holdKind
	}{
		{"Mutex", "mutex_unlock", mutexHold, mutexHold, mutexHold},
		{"RWMutex.Lock", "rwmutex_unlock", writeHold, writeHold, readHold},
		{"RWMutex.RLock", "rwmutex_unlock", writeHold, readHold, writeHold},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				src, err := dsync.ScriptSource(tc.script)
				if err != nil {
					t.Fatal(err)
				}
				sum := sha1.Sum([]byte(src))
				gate := &unlockGate{sha: hex.EncodeToString(sum[:])}
				wrdb := b.NewClient(t)
				wrdb.AddHook(gate)
				wc := dsync.New(wrdb, dsync.ClientReentrancy())
				// Messages to the owner's Client wait until let is
				// closed (probes go by): A never learns of its hold.
				let := make(chan struct{})
				var letOnce sync.Once
				release := func() { letOnce.Do(func() { close(let) }) }
				t.Cleanup(func() { release(); gate.open(); wc.Close() })
				var probed atomic.Int64
				dsync.SetMessageHook(wc, func(_, payload string) {
					if payload == "probe" {
						probed.Add(1)
						return
					}
					<-let
				})
				octx := dsync.WithOwner(ctx)
				first, mine := tc.first(newClient(t, b), name), tc.mine(wc, name)
				firstLock, firstUnlock, lock, unlock := first.lock, first.unlock, mine.lock, mine.unlock
				other := tc.other(newClient(t, b), name).try
				rdb := b.NewClient(t)

				must(t, firstLock(ctx))
				actx, cancel := context.WithCancel(octx)
				got := make(chan error, 1)
				go func() { got <- lock(actx) }() // A
				waitFor(t, 10*time.Second, "subscription of the waiter", func() bool {
					for _, ch := range []string{mutexKeys(name).Channel(), rwk(name).Channel()} {
						rdb.Publish(ctx, ch, "probe")
					}
					return probed.Load() > 0
				})
				// A tries again once subscribed (it was not before its
				// first attempt): that attempt must be refused, not race
				// with the release below.
				waitFor(t, 10*time.Second, "A's attempt after its subscription", func() bool { return gate.others.Load() >= 2 })
				gate.close()
				// The hold goes to A, which does not learn of it.
				must(t, firstUnlock(ctx))
				cancel()
				mustIs(t, <-got, context.Canceled, "A = %v, want context.Canceled")
				waitFor(t, 10*time.Second, "A's clean-up held back", func() bool { return gate.held.Load() > 0 })
				if err := lock(octx); err != nil { // B
					t.Fatalf("B = %v", err)
				}
				gate.open()
				dsync.WaitCleanups(wc)
				if ok, err := other(ctx); err != nil || ok {
					t.Fatalf("another process's attempt while B holds = %v, %v; want false (A's clean-up released B's hold)", ok, err)
				}
				if err := unlock(octx); err != nil {
					t.Fatalf("B's unlock = %v", err)
				}
				if ok, err := other(ctx); err != nil || !ok {
					t.Fatalf("another process's attempt after B's unlock = %v, %v; want true", ok, err)
				}
			})
		})
	}
}
