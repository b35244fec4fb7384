package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// An owner's re-entered quorum hold, one master of three killed mid-hold
// (a majority lives): the inner Unlock must succeed (scaling.md: "exclusion
// while a majority of masters live"; "With fewer than a majority of masters
// answering, Lock, TryLock and Unlock fail with ErrNoQuorum" - here a
// majority answers).
func TestQuorumReentrantUnlockMinorityDown(t *testing.T) {
	for _, mode := range []string{"script", "client"} {
		t.Run(mode, func(t *testing.T) {
			ss, rdbs := masters(t, 3)
			var opts []dsync.Option
			if mode == "client" {
				opts = append(opts, dsync.ClientReentrancy())
			}
			q := newQuorum(t, rdbs, append(opts, dsync.TTL(2*time.Second))...)
			ctx := ctxT(t)
			octx := dsync.WithOwner(ctx)
			name := redistest.Key(t)
			m := q.Mutex(name)
			must(t, m.Lock(octx))
			must(t, m.Lock(octx))
			ss[2].Stop() // one of three: a majority still lives
			if err := m.Unlock(octx); err != nil {
				t.Errorf("inner Unlock with 2 of 3 masters alive = %v, want nil", err)
			}
			// Still held by the owner: another process must not get in.
			other := newQuorum(t, rdbs).Mutex(name)
			if ok, err := other.TryLock(ctx); ok || err != nil {
				t.Errorf("other TryLock while owner holds a level = %v, %v; want false, nil", ok, err)
			}
			// Give it time: the dead master's member hold is lost by now.
			time.Sleep(2500 * time.Millisecond)
			err := m.Unlock(octx)
			t.Logf("second Unlock after waiting = %v", err)
			if err2 := m.Unlock(octx); err == nil && !errors.Is(err2, dsync.ErrNotHeld) {
				t.Errorf("third Unlock = %v, want ErrNotHeld", err2)
			}
			if err != nil {
				t.Errorf("outer Unlock with 2 of 3 masters alive = %v, want nil", err)
			}
			// The owner gave up calling Unlock; the name must come free at
			// the latest when the hold's lease runs out (TTL 2 s).
			free := false
			for i := 0; i < 30 && !free; i++ {
				ok, err := other.TryLock(ctx)
				if err != nil {
					t.Fatalf("other TryLock: %v", err)
				}
				if ok {
					free = true
					must(t, other.Unlock(ctx))
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if !free {
				l, err := m.Lease(octx)
				t.Errorf("name still held 6 s (3 TTLs) after the owner's Unlocks (the hold is renewed by nobody who can release it); owner's Lease = %v, err %v", l, err)
				if l != nil {
					t.Logf("owner's Lease.Err = %v", l.Err())
				}
			}
		})
	}
}

// An RWMutex's re-entered write hold, one master of three killed: the
// inner Unlock must succeed while a majority lives, and the owner can then
// take a read hold too (a downgrade).
func TestQuorumReentrantRUnlockMinorityDown(t *testing.T) {
	ss, rdbs := masters(t, 3)
	q := newQuorum(t, rdbs, dsync.TTL(2*time.Second))
	ctx := ctxT(t)
	octx := dsync.WithOwner(ctx)
	rw := q.RWMutex(redistest.Key(t))
	must(t, rw.Lock(octx))
	must(t, rw.Lock(octx))
	ss[0].Stop()
	if err := rw.Unlock(octx); err != nil {
		t.Errorf("inner write Unlock with 2 of 3 alive = %v, want nil", err)
	}
	must(t, rw.RLock(octx))
}

// One hung master of three (accepts, never answers), go-redis defaults:
// Lock/TryLock/Unlock must not be held back by it (scaling.md: "A slow or
// paused master does not hold calls back"), and each returns within its
// ctx deadline.
func TestQuorumHungMaster(t *testing.T) {
	_, live := masters(t, 2)
	hung := redis.NewClient(&redis.Options{Addr: silentAddr(t)})
	t.Cleanup(func() { hung.Close() })
	rdbs := []redis.UniversalClient{live[0], hung, live[1]}
	q := newQuorum(t, rdbs)
	ctx := ctxT(t)
	m := q.Mutex(redistest.Key(t))
	start := time.Now()
	err := m.Lock(ctx)
	t.Logf("Lock (no deadline) with a hung master: %v after %v", err, time.Since(start))
	must(t, err)
	start = time.Now()
	err = m.Unlock(ctx)
	took := time.Since(start)
	t.Logf("Unlock (no deadline) with a hung master: %v after %v", err, took)
	if took > 2*time.Second {
		t.Errorf("Unlock held back %v by one hung master of three", took)
	}
	must(t, m.Lock(ctx))
	cctx, cancel := context.WithTimeout(ctx, cancelAfter)
	defer cancel()
	start = time.Now()
	err = m.Unlock(cctx)
	took = time.Since(start)
	t.Logf("Unlock (deadline %v) with a hung master: %v after %v", cancelAfter, err, took)
	if err != nil {
		t.Errorf("Unlock with two masters releasing at once = %v, want nil", err)
	}
	if took > cancelAfter+slack {
		t.Errorf("Unlock overran its deadline: %v", took)
	}
}

// Unlock with one master of three paused: scaling.md "A slow or paused
// master does not hold calls back"; DESIGN "A call returns within its ctx
// deadline".
func TestQuorumUnlockWithMasterPaused(t *testing.T) {
	ps, rdbs := pausableMasters(t, 3)
	ctx := ctxT(t)
	name := redistest.Key(t)
	q := newQuorum(t, rdbs)
	m := q.Mutex(name)
	must(t, m.Lock(ctx))
	must(t, m.Unlock(ctx))
	must(t, m.Lock(ctx))
	ps[0].pause(t)
	start := time.Now()
	err := m.Unlock(ctx) // no deadline
	took := time.Since(start)
	t.Logf("Unlock (no deadline) with one of three paused: %v after %v", err, took)
	if err != nil {
		t.Errorf("Unlock with 2 of 3 answering = %v, want nil", err)
	}
	if took > time.Second {
		t.Errorf("Unlock with one master paused took %v: the paused master held the call back", took)
	}
	time.Sleep(pauseFor)
	// With a deadline.
	must(t, m.Lock(ctx))
	ps[1].pause(t)
	cctx, cancel := context.WithTimeout(ctx, cancelAfter)
	defer cancel()
	start = time.Now()
	err = m.Unlock(cctx)
	took = time.Since(start)
	t.Logf("Unlock (deadline %v) with one of three paused: %v after %v", cancelAfter, err, took)
	if took > cancelAfter+slack {
		t.Errorf("Unlock overran its deadline: %v", took)
	}
	if err != nil {
		t.Errorf("Unlock with 2 of 3 answering at once = %v, want nil", err)
	}
	time.Sleep(pauseFor)
	dsync.WaitCleanups(q)
	for i, rdb := range rdbs {
		if n, err := rdb.Exists(ctx, mutexKeys(name).Lock).Result(); n != 0 || err != nil {
			t.Errorf("master %d: lock key exists = %d, %v after Unlock; want 0", i, n, err)
		}
	}
}

// Fencing: an owner whose quorum hold was lost on a majority (keys deleted
// on two of three masters; the third still counts its stale hold) locks
// again after another process held and released the name. The new hold is
// a fresh acquisition: its token must exceed the other process's (DESIGN
// Fencing: "Each fresh acquisition of a name gets a token strictly larger
// than every earlier one for that name"). For a Mutex and an RWMutex
// writer, in both reentrancy modes.
func TestQuorumFencingAfterLossWithStaleMinority(t *testing.T) {
	type writeLock interface {
		lockLeaser
		TryLock(context.Context) (bool, error)
		Unlock(context.Context) error
	}
	for _, kind := range []struct {
		name string
		open func(q *dsync.Quorum, name string) writeLock
		key  func(name string) string // the key of the write hold
	}{
		{"Mutex", func(q *dsync.Quorum, n string) writeLock { return q.Mutex(n) }, func(n string) string { return mutexKeys(n).Lock }},
		{"RWMutex", func(q *dsync.Quorum, n string) writeLock { return q.RWMutex(n) }, func(n string) string { return rwk(n).Writer }},
	} {
		for _, mode := range []string{"script", "client"} {
			t.Run(kind.name+"/"+mode, func(t *testing.T) {
				rdbs := miniMasters(t, 3)
				opts := []dsync.Option{dsync.TTL(3 * time.Second)}
				if mode == "client" {
					opts = append(opts, dsync.ClientReentrancy())
				}
				q := newQuorum(t, rdbs, opts...)
				ctx := ctxT(t)
				octx := dsync.WithOwner(ctx)
				name := redistest.Key(t)
				key := kind.key(name)
				m := kind.open(q, name)
				l1 := lockLease(t, octx, m)
				for _, i := range []int{0, 1} {
					must(t, rdbs[i].Del(ctx, key).Err())
				}
				select {
				case <-l1.Done():
				case <-time.After(3 * time.Second):
					t.Fatal("lease not lost")
				}
				assertLeaseLost(t, l1)
				// Master 2 still holds the owner's stale hold.
				if n, _ := rdbs[2].Exists(ctx, key).Result(); n != 1 {
					t.Skip("stale hold on master 2 already gone")
				}
				p := kind.open(newQuorum(t, rdbs), name)
				lp := lockLease(t, ctx, p)
				tp := lp.Token()
				must(t, p.Unlock(ctx))
				must(t, m.Lock(octx))
				l2, err := m.Lease(octx)
				must(t, err)
				if l2.Token() <= tp {
					t.Errorf("owner's new hold token %d <= other process's earlier token %d (first hold's %d)", l2.Token(), tp, l1.Token())
				}
				// And exclusion: another process must not get in now.
				if ok, err := kind.open(newQuorum(t, rdbs), name).TryLock(ctx); ok || err != nil {
					t.Errorf("other TryLock beside owner's new hold = %v, %v", ok, err)
				}
				err = m.Unlock(octx)
				t.Logf("owner Unlock = %v", err)
				if ok, err := kind.open(newQuorum(t, rdbs), name).TryLock(ctx); !ok || err != nil {
					t.Errorf("other TryLock after owner's last Unlock = %v, %v", ok, err)
				}
			})
		}
	}
}

// A re-entry granted on a master that had not granted the first call
// starts renewing the hold there (scaling.md); the Lease is lost only when
// fewer than a majority still hold it. Here the first call is granted by
// masters 0 and 1 (2 is held by someone else), the re-entry also by 2;
// then master 0 loses the hold: masters 1 and 2, a majority, still hold
// and renew it, so the Lease must stay live.
func TestQuorumReentryMemberCountsForLease(t *testing.T) {
	for _, mode := range []string{"script", "client"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "client" {
				t.Skip("client reentrancy makes no round trip for a re-entry")
			}
			const ttl = time.Second
			rdbs := miniMasters(t, 3)
			ctx := ctxT(t)
			octx := dsync.WithOwner(ctx)
			name := redistest.Key(t)
			single := dsync.New(rdbs[2])
			t.Cleanup(func() { single.Close() })
			clog := single.Mutex(name)
			must(t, clog.Lock(ctx))
			q := newQuorum(t, rdbs, dsync.TTL(ttl))
			m := q.Mutex(name)
			l := lockLease(t, octx, m)
			must(t, clog.Unlock(ctx))
			must(t, m.Lock(octx)) // re-entry, granted by all three
			if n, _ := rdbs[2].Exists(ctx, mutexKeys(name).Lock).Result(); n != 1 {
				t.Fatal("re-entry not granted on master 2")
			}
			time.Sleep(2 * ttl)
			if n, _ := rdbs[2].Exists(ctx, mutexKeys(name).Lock).Result(); n != 1 {
				t.Fatal("hold on master 2 not renewed")
			}
			must(t, rdbs[0].Del(ctx, mutexKeys(name).Lock).Err())
			select {
			case <-l.Done():
				t.Errorf("lease ended (%v) though masters 1 and 2, a majority, still hold and renew it", l.Err())
			case <-time.After(2 * ttl):
			}
			if ok, err := newQuorum(t, rdbs).Mutex(name).TryLock(ctx); ok || err != nil {
				t.Errorf("other TryLock = %v, %v", ok, err)
			}
			err1 := m.Unlock(octx)
			err2 := m.Unlock(octx)
			t.Logf("unlocks: %v, %v", err1, err2)
			if err1 != nil || err2 != nil {
				t.Errorf("unlocks of a hold a majority kept = %v, %v; want nil, nil", err1, err2)
			}
		})
	}
}

// A TTL that Redlock's validity (TTL − elapsed − TTL/100 − 2 ms) leaves no
// time of is refused in quorum mode, on the Quorum and on a handle, before
// anything is sent; a TTL of 5 ms and the largest one ([dsync.MaxTTL]) are
// taken (one past it is refused as on a single deployment).
func TestQuorumRefusesATTLTooShortToBeGranted(t *testing.T) {
	rdbs := miniMasters(t, 3)
	ctx := ctxT(t)
	for _, ttl := range []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, dsync.MaxTTL + time.Millisecond} {
		name := redistest.Key(t)
		mustIs(t, newQuorum(t, rdbs, dsync.TTL(ttl)).Mutex(name).Lock(ctx), dsync.ErrInvalid, "Lock on a Quorum with TTL "+ttl.String())
		_, err := newQuorum(t, rdbs).RWMutex(name, dsync.TTL(ttl)).TryRLock(ctx)
		mustIs(t, err, dsync.ErrInvalid, "TryRLock on a quorum RWMutex with TTL "+ttl.String())
		for i, rdb := range rdbs {
			if n, _ := rdb.DBSize(ctx).Result(); n != 0 {
				t.Errorf("TTL %v: master %d holds %d keys after refused calls", ttl, i, n)
			}
		}
	}
	for _, ttl := range []time.Duration{5 * time.Millisecond, dsync.MaxTTL} {
		m := newQuorum(t, rdbs, dsync.TTL(ttl)).Mutex(redistest.Key(t))
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := m.Lock(cctx)
		cancel()
		if err != nil {
			t.Errorf("TTL %v: Lock on a free name = %v, want nil", ttl, err)
			continue
		}
		if err := m.Unlock(ctx); err != nil && !errors.Is(err, dsync.ErrLeaseLost) {
			t.Errorf("TTL %v: Unlock = %v", ttl, err)
		}
	}
}
