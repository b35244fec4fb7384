package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// waitDone waits up to within for l to be done and returns when it saw it,
// or stops the test, saying after what it waited.
func waitDone(t *testing.T, l *dsync.Lease, within time.Duration, after string) time.Time {
	t.Helper()
	select {
	case <-l.Done():
		return time.Now()
	case <-time.After(within):
		t.Fatalf("lease not done within %v %s", within, after)
		return time.Time{}
	}
}

func TestLeaseRenewalKeepsHold(t *testing.T) {
	b, ctx, name := realName(t)
	m := newClient(t, b, dsync.TTL(time.Second)).Mutex(name)
	l := lockLease(t, ctx, m)
	other := newClient(t, b).Mutex(name)
	for i := 0; i < 7; i++ { // 3.5 s, three and a half TTLs
		time.Sleep(500 * time.Millisecond)
		if ok, _ := other.TryLock(ctx); ok {
			t.Fatalf("lock taken by another after %v: renewal failed", time.Duration(i+1)*500*time.Millisecond)
		}
	}
	if err := l.Err(); err != nil {
		t.Fatalf("lease Err = %v while held", err)
	}
	must(t, m.Unlock(ctx))
	waitDone(t, l, time.Second, "after Unlock")
	if err := l.Err(); err != nil {
		t.Errorf("Err after Unlock = %v, want nil", err)
	}
	if ok, _ := other.TryLock(ctx); !ok {
		t.Fatal("lock not free after Unlock")
	}
}

// TestLeaseLossReported deletes the hold behind the holder's back in several
// ways; each time the holder must learn it within about one renewal interval,
// and Unlock must say so.
func TestLeaseLossReported(t *testing.T) {
	faults := map[string]func(ctx context.Context, b redistest.Backend, name string) error{
		"key deleted": func(ctx context.Context, b redistest.Backend, name string) error {
			return b.NewClient(t).Del(ctx, mutexKeys(name).Lock).Err()
		},
		"flushall": func(ctx context.Context, b redistest.Backend, name string) error {
			return b.NewClient(t).FlushAll(ctx).Err()
		},
		"taken over": func(ctx context.Context, b redistest.Backend, name string) error {
			rdb := b.NewClient(t)
			k := mutexKeys(name).Lock
			if err := rdb.Del(ctx, k).Err(); err != nil {
				return err
			}
			return rdb.HSet(ctx, k, "someone-else", 1).Err()
		},
	}
	for fault, do := range faults {
		t.Run(fault, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b redistest.Backend) {
				if fault == "flushall" && b.Mini == nil {
					// FLUSHALL on the shared server would disturb other tests.
					t.Skip("flushall only on miniredis")
				}
				ctx := ctxT(t)
				name := redistest.Key(t)
				const ttl = 900 * time.Millisecond
				m := newClient(t, b, dsync.TTL(ttl)).Mutex(name)
				l := lockLease(t, ctx, m)
				must(t, do(ctx, b, name))
				at := time.Now()
				waitDone(t, l, 3*ttl, "after "+fault) // one interval is ttl/3; generous bound
				t.Logf("loss reported after %v", time.Since(at))
				assertLeaseLost(t, l)
				checkIs(t, m.Unlock(ctx), dsync.ErrLeaseLost, "Unlock = %v, want ErrLeaseLost")
			})
		})
	}
}

func TestLeaseLostOnServerRestart(t *testing.T) {
	srv := redistest.StartStandalone(t)
	ctx := ctxT(t)
	c := dsync.New(srv.Client(t), dsync.TTL(900*time.Millisecond))
	defer c.Close()
	m := c.Mutex("restart")
	l := lockLease(t, ctx, m)
	srv.Restart() // no persistence: the hold is gone
	waitDone(t, l, 5*time.Second, "after the server restarted")
	assertLeaseLost(t, l)
	checkIs(t, m.Unlock(ctx), dsync.ErrLeaseLost, "Unlock = %v, want ErrLeaseLost")
	// The lock works again, with a larger fencing token than before.
	l2 := lockLease(t, ctx, m)
	if l2.Token() <= l.Token() {
		t.Errorf("token after restart %d, want > %d", l2.Token(), l.Token())
	}
	_ = m.Unlock(ctx)
}

func TestLeaseSurvivesConnectionsCut(t *testing.T) {
	srv := redistest.StartStandalone(t)
	ctx := ctxT(t)
	const ttl = 900 * time.Millisecond
	c1 := dsync.New(srv.Client(t), dsync.TTL(ttl))
	defer c1.Close()
	c2 := dsync.New(srv.Client(t), dsync.TTL(ttl))
	defer c2.Close()
	m1, m2 := c1.Mutex("cut"), c2.Mutex("cut")
	l := lockLease(t, ctx, m1)
	got := make(chan error, 1)
	go func() { got <- m2.Lock(ctx) }()
	time.Sleep(50 * time.Millisecond)
	// Cut every client connection, the waiter's pub/sub included.
	admin := srv.Client(t)
	must(t, admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal").Err())
	_ = admin.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err()
	time.Sleep(2 * ttl) // renewal must reconnect
	if err := l.Err(); err != nil {
		t.Fatalf("lease lost after a connection cut: %v", err)
	}
	select {
	case err := <-got:
		t.Fatalf("waiter got the lock while it was held (err %v)", err)
	default:
	}
	released := time.Now()
	must(t, m1.Unlock(ctx))
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("waiter woke %v after the release", time.Since(released))
	case <-time.After(2 * ttl):
		t.Fatal("waiter not woken after the release")
	}
	_ = m2.Unlock(ctx)
}

func TestLeaseStalledRenewerReportsLossBeforeExpiry(t *testing.T) {
	b, ctx, name := realName(t)
	const ttl = 600 * time.Millisecond
	c := newClient(t, b, dsync.TTL(ttl))
	m := c.Mutex(name)
	release := make(chan struct{})
	stall := func() { <-release }
	l := lockLease(t, ctx, m)
	dsync.SetRenewStall(c, stall)
	defer dsync.SetRenewStall(c, nil)
	defer close(release)
	// Another process waits; it may take the lock only once the server
	// expired the hold, and the holder must have been told by then.
	other := newClient(t, b).Mutex(name)
	must(t, other.Lock(ctx))
	acquired := time.Now()
	select {
	case <-l.Done():
	default:
		t.Fatal("another process holds the lock, and the stalled holder was not told")
	}
	assertLeaseLost(t, l)
	t.Logf("other acquired %v after the hold began", acquired.Sub(time.Now().Add(-time.Since(acquired))))
	_ = other.Unlock(ctx)
}

func TestFencingTokensIncrease(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		var last uint64
		check := func(m *dsync.Mutex, what string) {
			t.Helper()
			l := lockLease(t, ctx, m)
			if l.Token() <= last {
				t.Fatalf("%s: token %d, want > %d", what, l.Token(), last)
			}
			last = l.Token()
			must(t, m.Unlock(ctx))
		}
		c := newClient(t, b)
		m := c.Mutex(name)
		for i := 0; i < 5; i++ {
			check(m, "same handle")
			check(c.Mutex(name), "new handle")
			check(newClient(t, b).Mutex(name), "new client")
		}
		// A fresh Client (a restarted process) continues the sequence.
		c.Close()
		check(newClient(t, b).Mutex(name), "restarted client")
		// Even when the bookkeeping expired (or was deleted), tokens rise.
		must(t, b.NewClient(t).Del(ctx, mutexKeys(name).Fence).Err())
		check(m2(newClient(t, b), name), "after the fence hash expired")
		// And when the counter lags behind the last token, as on a promoted
		// replica that missed the last writes.
		must(t, b.NewClient(t).HSet(ctx, mutexKeys(name).Fence, "n", 1).Err())
		check(m2(newClient(t, b), name), "after the counter fell behind")
		// Re-entry keeps the token.
		octx := dsync.WithOwner(ctx)
		mm := newClient(t, b).Mutex(name)
		_ = mm.Lock(octx)
		l1, _ := mm.Lease(octx)
		_ = mm.Lock(octx)
		l2, _ := mm.Lease(octx)
		if l1.Token() != l2.Token() || l1.Token() <= last {
			t.Errorf("re-entry tokens %d, %d; want equal and > %d", l1.Token(), l2.Token(), last)
		}
		_ = mm.Unlock(octx)
		_ = mm.Unlock(octx)
	})
}

func m2(c *dsync.Client, name string) *dsync.Mutex { return c.Mutex(name) }

func TestDeadHolderFreesAtTTL(t *testing.T) {
	b, ctx, name := realName(t)
	const ttl = time.Second
	dead := dsync.New(b.NewClient(t), dsync.TTL(ttl))
	must(t, dead.Mutex(name).Lock(ctx))
	start := time.Now()
	dead.Close() // the process dies: nobody renews or releases
	must(t, newClient(t, b).Mutex(name).Lock(ctx))
	waited := time.Since(start)
	t.Logf("waiter acquired %v after the holder died (TTL %v)", waited, ttl)
	if waited > ttl+500*time.Millisecond {
		t.Errorf("waited %v, want about the TTL %v (waiters sleep on the TTL, not a poll interval)", waited, ttl)
	}
}

func TestDeadHolderOnMiniredis(t *testing.T) {
	b := redistest.Miniredis(t)
	ctx := ctxT(t)
	dead := dsync.New(b.NewClient(t), dsync.TTL(time.Second))
	must(t, dead.Mutex("x").Lock(ctx))
	dead.Close()
	m := newClient(t, b).Mutex("x")
	if ok, _ := m.TryLock(ctx); ok {
		t.Fatal("lock free before its TTL")
	}
	b.Advance(1100 * time.Millisecond)
	if ok, err := m.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock after the TTL = %v, %v; want true", ok, err)
	}
}

func TestFixedLeaseRunsOut(t *testing.T) {
	b, ctx, name := realName(t)
	counter := &redistest.Counter{}
	c, _ := hookedClient(t, b, counter, dsync.TTL(500*time.Millisecond), dsync.FixedLease())
	m := c.Mutex(name)
	start := time.Now()
	l := lockLease(t, ctx, m)
	counter.Reset()
	// Reported lost no later than the server's expiry: the local deadline
	// at which the loss is reported is within the TTL of the Lock call's
	// start. (When Done closes after that deadline depends on the
	// scheduler of a loaded machine, not on dsync.)
	if d := dsync.LeaseDeadline(l); d.After(start.Add(500 * time.Millisecond)) {
		t.Errorf("loss due %v after Lock, after the TTL", d.Sub(start))
	}
	waitDone(t, l, 2*time.Second, "after its deadline")
	assertLeaseLost(t, l)
	if n := counter.RoundTrips(); n != 0 {
		t.Errorf("a fixed lease sent %d commands while held, want 0", n)
	}
	time.Sleep(300 * time.Millisecond) // now the server has expired it too
	checkIs(t, m.Unlock(ctx), dsync.ErrLeaseLost, "Unlock = %v, want ErrLeaseLost")
}

func TestMaxHoldBoundsRenewal(t *testing.T) {
	b, ctx, name := realName(t)
	m := newClient(t, b, dsync.TTL(300*time.Millisecond), dsync.MaxHold(600*time.Millisecond)).Mutex(name)
	l := lockLease(t, ctx, m)
	start := time.Now()
	waitDone(t, l, 3*time.Second, "after MaxHold")
	// Renewal stops short of MaxHold: the hold ends after MaxHold less
	// at most one TTL, and never after MaxHold.
	if held := time.Since(start); held < 300*time.Millisecond || held > 700*time.Millisecond {
		t.Errorf("hold lasted %v, want within (MaxHold - TTL, MaxHold] = (0.3 s, 0.6 s] plus slack", held)
	}
	assertLeaseLost(t, l)
}

func TestLeaseAfterLongWaitIsLive(t *testing.T) {
	b, ctx, name := realName(t)
	const ttl = 750 * time.Millisecond // renewed every 250 ms: 500 ms of slack
	holder := newClient(t, b, dsync.TTL(ttl)).Mutex(name)
	waiter := newClient(t, b, dsync.TTL(ttl)).Mutex(name)
	must(t, holder.Lock(ctx))
	got := make(chan error, 1)
	go func() { got <- waiter.Lock(ctx) }()
	time.Sleep(3 * ttl) // the waiter waits longer than its TTL
	must(t, holder.Unlock(ctx))
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	l, err := waiter.Lease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * ttl) // renewal keeps it
	if err := l.Err(); err != nil {
		t.Fatalf("lease after a long wait: Err = %v, want nil", err)
	}
	must(t, waiter.Unlock(ctx))
}

// TestLeaseRenewalManyNames keeps holds on names in many hash slots alive
// together: their renewals share calls, grouped by slot on a cluster.
func TestLeaseRenewalManyNames(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		c := newClient(t, b, dsync.TTL(900*time.Millisecond))
		other := newClient(t, b)
		base := redistest.Key(t)
		var ms []*dsync.Mutex
		for i := 0; i < 12; i++ {
			m := c.Mutex(base + "-" + string(rune('a'+i)))
			must(t, m.Lock(ctx))
			ms = append(ms, m)
		}
		// Holds of the other primitives, renewed by their own batch scripts.
		rw := c.RWMutex(base + "-rw")
		must(t, rw.RLock(ctx))
		rwx := c.RWMutex(base + "-rwx")
		must(t, rwx.Lock(ctx))
		sem := c.Semaphore(base+"-sem", 2)
		must(t, sem.Acquire(ctx, 2))
		onceRan := make(chan struct{})
		onceDone := make(chan error, 1)
		go func() {
			onceDone <- c.Once(base+"-once").Do(ctx, func(fctx context.Context) error {
				close(onceRan)
				select {
				case <-time.After(2700 * time.Millisecond):
					return nil
				case <-fctx.Done():
					return context.Cause(fctx)
				}
			})
		}()
		<-onceRan
		time.Sleep(2700 * time.Millisecond) // three TTLs
		if ok, _ := other.RWMutex(base + "-rw").TryLock(ctx); ok {
			t.Fatal("read hold expired: renewal failed")
		}
		if ok, _ := other.RWMutex(base + "-rwx").TryRLock(ctx); ok {
			t.Fatal("write hold expired: renewal failed")
		}
		if ok, _ := other.Semaphore(base+"-sem", 2).TryAcquire(ctx, 1); ok {
			t.Fatal("permits expired: renewal failed")
		}
		if err := <-onceDone; err != nil {
			t.Fatalf("Once.Do = %v: the run lease was not kept", err)
		}
		_ = rw.RUnlock(ctx)
		_ = rwx.Unlock(ctx)
		_ = sem.Release(ctx, 2)
		for i, m := range ms {
			l, err := m.Lease(ctx)
			if err != nil || l.Err() != nil {
				t.Fatalf("hold %d: Lease = %v, %v", i, l, err)
			}
			if ok, _ := other.Mutex(base + "-" + string(rune('a'+i))).TryLock(ctx); ok {
				t.Fatalf("hold %d expired: renewal failed", i)
			}
			must(t, m.Unlock(ctx))
		}
	})
}

// A hold whose lease was reported lost (renewals held back past its local
// deadline) while the server still had it (its expiry moved out here) is
// released by its Unlock or Release, which returns ErrLeaseLost all the
// same: a lease reported lost stays lost (README: "Unlock then returns
// ErrLeaseLost"), and the name is free afterwards.
func TestReleaseOfAHoldReportedLostStillThere(t *testing.T) {
	kinds := []struct {
		name string
		// take takes the name through c, and returns its lease and the
		// release of the hold through the same handle.
		take func(ctx context.Context, c *dsync.Client, name string) (*dsync.Lease, func() error, error)
		// keep moves the hold's expiry in Redis out to a minute.
		keep func(ctx context.Context, rdb redis.UniversalClient, name string) error
		try  func(ctx context.Context, c *dsync.Client, name string) (bool, error)
	}{
		{"Mutex",
			func(ctx context.Context, c *dsync.Client, n string) (*dsync.Lease, func() error, error) {
				m := c.Mutex(n)
				if err := m.Lock(ctx); err != nil {
					return nil, nil, err
				}
				l, err := m.Lease(ctx)
				return l, func() error { return m.Unlock(ctx) }, err
			},
			func(ctx context.Context, rdb redis.UniversalClient, n string) error {
				return rdb.PExpire(ctx, mutexKeys(n).Lock, time.Minute).Err()
			},
			func(ctx context.Context, c *dsync.Client, n string) (bool, error) { return c.Mutex(n).TryLock(ctx) }},
		{"Semaphore",
			func(ctx context.Context, c *dsync.Client, n string) (*dsync.Lease, func() error, error) {
				s := c.Semaphore(n, 1)
				if err := s.Acquire(ctx, 1); err != nil {
					return nil, nil, err
				}
				l, err := s.Lease(ctx)
				return l, func() error { return s.Release(ctx, 1) }, err
			},
			func(ctx context.Context, rdb redis.UniversalClient, n string) error {
				k := semKeys(n)
				tm, err := rdb.Time(ctx).Result()
				if err != nil {
					return err
				}
				dl := tm.Add(time.Minute).UnixMilli()
				holders, err := rdb.ZRange(ctx, k.Holders, 0, -1).Result()
				if err != nil || len(holders) != 1 {
					return fmt.Errorf("holders %v, %v; want one", holders, err)
				}
				if err := rdb.ZAddXX(ctx, k.Holders, redis.Z{Score: float64(dl), Member: holders[0]}).Err(); err != nil {
					return err
				}
				if err := rdb.PExpire(ctx, k.State, time.Minute).Err(); err != nil {
					return err
				}
				return rdb.PExpire(ctx, k.Holders, time.Minute).Err()
			},
			func(ctx context.Context, c *dsync.Client, n string) (bool, error) {
				return c.Semaphore(n, 1).TryAcquire(ctx, 1)
			}},
	}
	for _, k := range kinds {
		for _, owned := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/owned=%v", k.name, owned), func(t *testing.T) {
				eachRealName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
					// The lease's local deadline passes in real time.
					if owned {
						ctx = dsync.WithOwner(ctx)
					}
					rdb := b.NewClient(t)
					c := newClient(t, b, dsync.TTL(time.Second))
					stall := make(chan struct{})
					t.Cleanup(func() { close(stall) })
					l, release, err := k.take(ctx, c, name)
					must(t, err)
					must(t, k.keep(ctx, rdb, name))
					dsync.SetRenewStall(c, func() { <-stall })
					waitDone(t, l, 10*time.Second, "(renewals held back)")
					if !errors.Is(l.Err(), dsync.ErrLeaseLost) {
						t.Fatalf("lease after its renewals were held back: %v, want ErrLeaseLost", l.Err())
					}
					if err := release(); !errors.Is(err, dsync.ErrLeaseLost) {
						t.Errorf("release of a hold reported lost: %v, want ErrLeaseLost", err)
					}
					if !errors.Is(l.Err(), dsync.ErrLeaseLost) {
						t.Errorf("lease after the release: %v, want ErrLeaseLost still", l.Err())
					}
					ok, err := k.try(ctxT(t), newClient(t, b), name)
					if err != nil || !ok {
						t.Errorf("another process after the release: %v, %v; want the name (the hold was released)", ok, err)
					}
				})
			})
		}
	}
}

// TestFixedLeaseReentryKeepsTTL: under FixedLease a hold lasts exactly its
// TTL from the Lock that took it, in both reentrancy modes: a script
// re-entry does not extend the expiry Redis keeps, so once the Lease
// reports lost another owner takes the name well before the re-entry's
// TTL would have run out.
func TestFixedLeaseReentryKeepsTTL(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts []dsync.Option
	}{{"script", nil}, {"client", []dsync.Option{dsync.ClientReentrancy()}}} {
		t.Run(mode.name, func(t *testing.T) {
			b, ctx, name := realName(t)
			opts := append([]dsync.Option{dsync.TTL(fixedReentryTTL), dsync.FixedLease()}, mode.opts...)
			m := newClient(t, b, opts...).Mutex(name)
			other := newClient(t, b, dsync.TTL(fixedReentryTTL)).Mutex(name)
			octx := dsync.WithOwner(ctx)
			checkFixedReentryKeepsTTL(t, octx, m.Lock, m.Lease, other.TryLock)
		})
	}
}

// fixedReentryTTL is the TTL of checkFixedReentryKeepsTTL's holds: long
// enough that the margins it leaves survive a loaded machine.
const fixedReentryTTL = 3 * time.Second

// checkFixedReentryKeepsTTL takes a hold by lock (a FixedLease handle of
// TTL fixedReentryTTL, ctx an owner), re-enters it half a TTL later, and
// checks that once its Lease reports lost, try (another owner's TryLock)
// takes the name before the re-entry's own TTL would have run out, less
// 500 ms: Redis did not keep the hold for the re-entry. (Before, a
// re-entry extended the hold in Redis to its own TTL: try failed until
// then.)
func checkFixedReentryKeepsTTL(t *testing.T, ctx context.Context, lock func(context.Context) error,
	lease func(context.Context) (*dsync.Lease, error), try func(context.Context) (bool, error)) {
	t.Helper()
	checkReentryKeepsTTL(t, ctx, fixedReentryTTL/2, lock, lease, try)
}

// checkReentryKeepsTTL is checkFixedReentryKeepsTTL with the re-entry
// after the given time from the Lock, for a handle of TTL fixedReentryTTL
// whose lease is not extended past a bound (FixedLease, or MaxHold: then
// the re-entry must come after the last renewal's deadline less a TTL,
// so that a re-entry that extends the hold passes it).
func checkReentryKeepsTTL(t *testing.T, ctx context.Context, after time.Duration, lock func(context.Context) error,
	lease func(context.Context) (*dsync.Lease, error), try func(context.Context) (bool, error)) {
	t.Helper()
	start := time.Now()
	must(t, lock(ctx))
	l, err := lease(ctx)
	must(t, err)
	time.Sleep(time.Until(start.Add(after)))
	reentered := time.Now()
	must(t, lock(ctx))
	if isDone(l) {
		t.Skip("the machine stalled: the hold's lease ended before its re-entry returned")
	}
	waitDone(t, l, 2*fixedReentryTTL, "after its TTL")
	assertLeaseLost(t, l)
	octx := dsync.WithOwner(ctx)
	until := reentered.Add(fixedReentryTTL - 500*time.Millisecond)
	for {
		ok, err := try(octx)
		must(t, err)
		if ok {
			return
		}
		if time.Now().After(until) {
			t.Fatalf("another owner's try failed until %v after the re-entry, its Lease lost: the re-entry extended the hold in Redis",
				time.Since(reentered).Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
