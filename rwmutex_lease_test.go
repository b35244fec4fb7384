package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// RWMutex leases: expiry, fixed leases, renewal while waiting, loss.

func TestRWMutexReaderLeaseExpiresAlone(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		// A reader whose process dies: its Client stops renewing.
		dead := dsync.New(b.NewClient(t))
		dr := dead.RWMutex(name, dsync.TTL(300*time.Millisecond))
		must(t, dr.RLock(ctx))
		// Two live readers, renewed (their TTL outlasts the test anyway).
		live1 := newClient(t, b).RWMutex(name)
		live2 := newClient(t, b).RWMutex(name)
		for _, r := range []*dsync.RWMutex{live1, live2} {
			must(t, r.RLock(ctx))
		}
		dead.Close()
		b.Advance(500 * time.Millisecond)

		rdb := b.NewClient(t)
		w := newClient(t, b).RWMutex(name)
		// One reader's unlock leaves the other reader's share alone.
		must(t, live1.RUnlock(ctx))
		if ok, err := w.TryLock(ctx); ok || err != nil {
			t.Fatalf("TryLock while a live reader holds = %v, %v; want false", ok, err)
		}
		if n, _ := rdb.ZCard(ctx, rwk(name).Readers).Result(); n != 1 {
			t.Errorf("readers in Redis = %d, want 1 (the dead reader's share expired alone)", n)
		}
		if l, err := live2.RLease(ctx); err != nil || l.Err() != nil {
			t.Fatalf("live reader's lease = %v, %v; want live", l, err)
		}
		must(t, live2.RUnlock(ctx))
		if ok, err := w.TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock after the live readers left = %v, %v; want true", ok, err)
		}
		must(t, w.Unlock(ctx))
	})
}

func TestRWMutexFixedLeaseRunsOut(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		short := c.RWMutex(name, dsync.TTL(200*time.Millisecond), dsync.FixedLease())
		long := c.RWMutex(name)
		must(t, short.RLock(ctx))
		must(t, long.RLock(ctx))
		l, err := short.RLease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b.Advance(250 * time.Millisecond)
		waitDone(t, l, 5*time.Second, "(a fixed read lease)")
		assertLeaseLost(t, l)
		checkIs(t, short.RUnlock(ctx), dsync.ErrLeaseLost, "RUnlock after the lease ran out = %v, want ErrLeaseLost")
		if l, err := long.RLease(ctx); err != nil || l.Err() != nil {
			t.Fatalf("the other reader's lease = %v, %v; want live", l, err)
		}
		if err := long.RUnlock(ctx); err != nil {
			t.Fatalf("the other reader's RUnlock = %v", err)
		}
	})
}

func TestRWMutexLongWaitKeepsLease(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		// Renewed every 200 ms: a renewal may come 400 ms late (a loaded
		// machine) before a lease runs out.
		const ttl = 600 * time.Millisecond
		writer := newClient(t, b).RWMutex(name)
		must(t, writer.Lock(ctx))
		// Readers and a writer that wait much longer than their TTL.
		reader := newClient(t, b).RWMutex(name, dsync.TTL(ttl))
		w2 := newClient(t, b).RWMutex(name, dsync.TTL(ttl))
		rgot := make(chan error, 1)
		go func() { rgot <- reader.RLock(ctx) }()
		time.Sleep(2 * ttl)
		must(t, writer.Unlock(ctx))
		if err := <-rgot; err != nil {
			t.Fatal(err)
		}
		wgot := make(chan error, 1)
		go func() { wgot <- w2.Lock(ctx) }()
		time.Sleep(2 * ttl)
		l, err := reader.RLease(ctx)
		if err != nil || l.Err() != nil {
			t.Fatalf("admitted reader's lease after %v = %v, %v; want live", 2*ttl, l, err)
		}
		if err := reader.RUnlock(ctx); err != nil {
			t.Fatalf("RUnlock = %v", err)
		}
		if err := <-wgot; err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * ttl)
		if l, err := w2.Lease(ctx); err != nil || l.Err() != nil {
			t.Fatalf("writer's lease after a long wait = %v, %v; want live", l, err)
		}
		if err := w2.Unlock(ctx); err != nil {
			t.Fatalf("Unlock = %v", err)
		}
	})
}

// TestRWMutexClientReentrancyLeaseLoss loses a hold of three levels behind
// its owner's back: in both reentrancy modes the first unlock reports the
// loss and the others find nothing held.
func TestRWMutexClientReentrancyLeaseLoss(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, mode := range reentrancyModes {
			for _, lock := range []string{"read", "write"} {
				t.Run(mode.name+"/"+lock, func(t *testing.T) {
					ctx := dsync.WithOwner(ctxT(t))
					name := redistest.Key(t)
					const ttl = 600 * time.Millisecond
					rw := newClient(t, b, append([]dsync.Option{dsync.TTL(ttl)}, mode.opts...)...).RWMutex(name)
					acquire, release, lease := rw.Lock, rw.Unlock, rw.Lease
					keys := []string{rwk(name).Writer}
					if lock == "read" {
						acquire, release, lease = rw.RLock, rw.RUnlock, rw.RLease
						keys = []string{rwk(name).Readers, rwk(name).ReaderData}
					}
					for i := 0; i < 3; i++ {
						must(t, acquire(ctx))
					}
					l, err := lease(ctx)
					if err != nil {
						t.Fatal(err)
					}
					// The hold vanishes behind the owner's back.
					must(t, b.NewClient(t).Del(ctx, keys...).Err())
					waitDone(t, l, 3*ttl, "after its keys were deleted")
					assertLeaseLost(t, l)
					// Each of the three levels is gone: the first unlock says
					// so, the others find nothing.
					checkIs(t, release(ctx), dsync.ErrLeaseLost, "first unlock after the loss = %v, want ErrLeaseLost")
					for i := 0; i < 2; i++ {
						if err := release(ctx); !errors.Is(err, dsync.ErrNotHeld) {
							t.Errorf("unlock %d after the loss = %v, want ErrNotHeld", i+2, err)
						}
					}
					if _, err := lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
						t.Errorf("lease after the loss = %v, want ErrNotHeld", err)
					}
					// A new lock is a fresh hold, released by one unlock.
					must(t, acquire(ctx))
					if l2, err := lease(ctx); err != nil || l2.Err() != nil {
						t.Fatalf("lease of the new hold = %v, %v; want live", l2, err)
					}
					must(t, release(ctx))
					checkIs(t, release(ctx), dsync.ErrNotHeld, "extra unlock = %v, want ErrNotHeld")
					assertRWReleased(t, b, name)
				})
			}
		}
	})
}

// Under client reentrancy a re-entry trusts the Client's record (the
// ClientReentrancy godoc): with the renewals held back, a hold whose keys
// were deleted is re-entered with no round trip; once a renewal goes out,
// the Lease reports the loss, the first unlock says so, and another owner
// takes the name.
func TestClientReentrancyReentersALossNotYetKnown(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		rec := &redistest.Recorder{}
		// A long lease, renewed every second: held-back renewals cannot
		// let its local deadline pass before the check.
		c, rdb := hookedClient(t, b, rec, dsync.TTL(time.Minute), dsync.RenewEvery(time.Second), dsync.ClientReentrancy())
		held := make(chan struct{})
		dsync.SetRenewStall(c, func() { <-held })
		ctx := dsync.WithOwner(ctxT(t))
		name := redistest.Key(t)
		m := c.Mutex(name)
		must(t, m.Lock(ctx))
		l, err := m.Lease(ctx)
		must(t, err)
		must(t, rdb.Del(ctx, mutexKeys(name).Lock).Err())
		rec.Reset()
		must(t, m.Lock(ctx)) // the re-entry
		if n := len(rec.All()); n != 0 {
			t.Fatalf("the re-entry sent %d commands, want none", n)
		}
		if l.Err() != nil {
			t.Fatalf("Lease Err before a renewal = %v, want nil (the Client does not know yet)", l.Err())
		}
		close(held)
		waitDone(t, l, 10*time.Second, "after a renewal found the keys deleted")
		assertLeaseLost(t, l)
		checkIs(t, m.Unlock(ctx), dsync.ErrLeaseLost, "first unlock after the loss = %v, want ErrLeaseLost")
		if ok, err := newClient(t, b).Mutex(name).TryLock(dsync.WithOwner(ctxT(t))); err != nil || !ok {
			t.Fatalf("another owner's TryLock after the loss = %v, %v; want true", ok, err)
		}
	})
}

// TestRWMutexFixedLeaseReentryKeepsTTL: as TestFixedLeaseReentryKeepsTTL,
// for write and read re-entries: under FixedLease a re-entry does not
// extend the hold in Redis, so once the Lease reports lost a writer of
// another owner takes the name.
func TestRWMutexFixedLeaseReentryKeepsTTL(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts []dsync.Option
	}{{"script", nil}, {"client", []dsync.Option{dsync.ClientReentrancy()}}} {
		for _, read := range []bool{false, true} {
			sub := mode.name + "/write"
			if read {
				sub = mode.name + "/read"
			}
			t.Run(sub, func(t *testing.T) {
				b, ctx, name := realName(t)
				opts := append([]dsync.Option{dsync.TTL(fixedReentryTTL), dsync.FixedLease()}, mode.opts...)
				rw := newClient(t, b, opts...).RWMutex(name)
				other := newClient(t, b, dsync.TTL(fixedReentryTTL)).RWMutex(name)
				lock, lease := rw.Lock, rw.Lease
				if read {
					lock, lease = rw.RLock, rw.RLease
				}
				checkFixedReentryKeepsTTL(t, dsync.WithOwner(ctx), lock, lease, other.TryLock)
			})
		}
	}
}
