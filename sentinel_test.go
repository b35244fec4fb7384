package dsync_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// holdLog is what the test observes of holds: which are held at once, and
// whether a hold that overlapped a later one was reported lost.
type holdLog struct {
	mu       sync.Mutex
	active   map[*obsHold]struct{}
	overlaps [][2]*obsHold // earlier, later
	tokens   []uint64      // in grant order
}

type obsHold struct {
	token uint64
	lease *dsync.Lease
	lost  atomic.Bool // Unlock said ErrLeaseLost
}

func (l *holdLog) acquired(h *obsHold) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active == nil {
		l.active = make(map[*obsHold]struct{})
	}
	for o := range l.active {
		l.overlaps = append(l.overlaps, [2]*obsHold{o, h})
	}
	l.active[h] = struct{}{}
	l.tokens = append(l.tokens, h.token)
}

func (l *holdLog) released(h *obsHold) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.active, h)
}

// check asserts that holds overlapped only when the earlier one was
// reported lost and the later one has the larger fencing token.
func (l *holdLog) check(t *testing.T, wait time.Duration) {
	t.Helper()
	for _, p := range l.overlaps {
		early, late := p[0], p[1]
		if late.token <= early.token {
			t.Errorf("overlapping holds: later token %d ≤ earlier %d", late.token, early.token)
		}
		select {
		case <-early.lease.Done():
		case <-time.After(wait):
		}
		if !early.lost.Load() && !errors.Is(early.lease.Err(), dsync.ErrLeaseLost) {
			t.Errorf("holds %d and %d overlapped, and %d was not reported lost (Err %v)",
				early.token, late.token, early.token, early.lease.Err())
		}
	}
	t.Logf("%d holds, %d overlaps (each reported lost)", len(l.tokens), len(l.overlaps))
}

func TestSentinelFailoverWithHoldsAndWaiters(t *testing.T) {
	s := redistest.StartSentinel(t)
	ctx := ctxT(t)
	name := redistest.Key(t)
	const workers, ttl = 3, 2 * time.Second
	var log holdLog
	var after [workers]atomic.Int64 // acquisitions after the failover
	var switched atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range workers {
		c := dsync.New(s.NewClient(t), dsync.TTL(ttl))
		defer c.Close()
		m := c.Mutex(name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(40 * time.Second)
			for time.Now().Before(deadline) {
				select {
				case <-stop:
					return
				default:
				}
				lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err := m.Lock(lctx)
				cancel()
				if err != nil {
					// The failover window: connections drop, the master
					// is read-only for a moment.
					time.Sleep(20 * time.Millisecond)
					continue
				}
				l, err := m.Lease(ctx)
				if err != nil {
					t.Errorf("Lease after Lock: %v", err)
					return
				}
				h := &obsHold{token: l.Token(), lease: l}
				log.acquired(h)
				if switched.Load() {
					after[i].Add(1)
				}
				time.Sleep(10 * time.Millisecond)
				log.released(h)
				if err := m.Unlock(ctx); errors.Is(err, dsync.ErrLeaseLost) {
					h.lost.Store(true)
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // holds and waiters under way
	addr := s.Failover()
	switched.Store(true)
	t.Logf("failed over to %s", addr)
	// Every waiter acquires again on the new master.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		done := true
		for i := range workers {
			done = done && after[i].Load() > 0
		}
		if done {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	for i := range workers {
		if after[i].Load() == 0 {
			t.Errorf("worker %d never acquired after the failover", i)
		}
	}
	log.check(t, 2*ttl)
}

// TestSentinelFailoverLosesUnreplicatedHold takes a hold on the old master
// in the failover window, after the replica was promoted and before the old
// master was turned into a replica: the promoted master never saw it, so
// another client gets the lock, and the first holder is told its lease is
// lost. With WaitReplicas the same Lock fails with ErrNotReplicated instead.
func TestSentinelFailoverLosesUnreplicatedHold(t *testing.T) {
	s := redistest.StartSentinel(t)
	ctx := ctxT(t)
	old, replica := s.Nodes()[0], s.Nodes()[1]
	direct := old.Client(t) // stays on the old master, as a stale client would
	const ttl = 2 * time.Second
	c := dsync.New(direct, dsync.TTL(ttl))
	defer c.Close()
	cw := dsync.New(direct, dsync.TTL(ttl), dsync.WaitReplicas(1, 100*time.Millisecond))
	defer cw.Close()
	name, wname := redistest.Key(t), redistest.Key(t)
	if err := cw.Mutex(wname).Lock(ctx); err != nil {
		t.Fatalf("Lock with WaitReplicas before the failover = %v, want nil (the replica acknowledges)", err)
	}
	if err := cw.Mutex(wname).Unlock(ctx); err != nil && !errors.Is(err, dsync.ErrNotHeld) {
		t.Fatal(err)
	}

	sc := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddrs()[0]})
	defer sc.Close()
	must(t, sc.Failover(ctx, redistest.SentinelMaster).Err())
	rrep := replica.Client(t)
	promoted := time.Now().Add(10 * time.Second)
	for time.Now().Before(promoted) {
		if info, _ := rrep.Info(ctx, "replication").Result(); strings.Contains(info, "role:master") {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// The window: the old master still accepts writes nobody replicates.
	m := c.Mutex(name)
	if err := m.Lock(ctx); err != nil {
		t.Skipf("failover window missed (the old master was already demoted): %v", err)
	}
	werr := cw.Mutex(wname + "x").Lock(ctx)
	lease, _ := m.Lease(ctx)

	s.WaitFailover(old.Addr())
	other := dsync.New(s.NewClient(t), dsync.TTL(ttl))
	defer other.Close()
	if ok, err := other.Mutex(name).TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock on the new master = %v, %v; want the lock (the old hold was not replicated)", ok, err)
	}
	select {
	case <-lease.Done():
	case <-time.After(3 * ttl):
	}
	checkIs(t, lease.Err(), dsync.ErrLeaseLost, "Lease.Err of the vanished hold = %v, want ErrLeaseLost")
	if !errors.Is(werr, dsync.ErrNotReplicated) {
		t.Errorf("Lock with WaitReplicas in the window = %v, want ErrNotReplicated", werr)
	}
}

// BenchmarkWaitReplicas is one uncontended Lock+Unlock on a master with one
// replica, without and with WaitReplicas(1, 1s).
func BenchmarkWaitReplicas(b *testing.B) {
	s := redistest.StartSentinel(b)
	for _, n := range []int{0, 1} {
		b.Run("replicas="+string(rune('0'+n)), func(b *testing.B) {
			rdb := s.Nodes()[0].Client(b)
			counter := &redistest.Counter{}
			rdb.AddHook(counter)
			var opts []dsync.Option
			if n > 0 {
				opts = append(opts, dsync.WaitReplicas(n, time.Second))
			}
			c := dsync.New(rdb, opts...)
			defer c.Close()
			m := c.Mutex(redistest.Key(b))
			ctx := context.Background()
			reportLockUnlock(b, counter, ctx, m.Lock, m.Unlock)
		})
	}
}
