package dsync_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// masters starts n private redis-servers and returns them with one go-redis
// client each. The clients fail fast on a dead server.
func masters(t *testing.T, n int) ([]*redistest.Server, []redis.UniversalClient) {
	t.Helper()
	var ss []*redistest.Server
	var rdbs []redis.UniversalClient
	for range n {
		s := redistest.StartStandalone(t)
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), DialTimeout: 200 * time.Millisecond, MaxRetries: 1})
		t.Cleanup(func() { _ = rdb.Close() })
		ss = append(ss, s)
		rdbs = append(rdbs, rdb)
	}
	return ss, rdbs
}

func newQuorum(t *testing.T, rdbs []redis.UniversalClient, opts ...dsync.Option) *dsync.Quorum {
	t.Helper()
	c := dsync.NewQuorum(rdbs, opts...)
	t.Cleanup(func() { c.Close() })
	return c
}

// hammer runs clients×2 goroutines that lock and unlock name rounds times
// each and checks that no two held it at once and that fencing tokens rose.
func hammer(t *testing.T, cs []*dsync.Quorum, name string, rounds int) {
	t.Helper()
	ctx := ctxT(t)
	var h mutexHolders
	var tokens rising
	pause := func() time.Duration { return 200 * time.Microsecond }
	var steps []func() error
	for _, c := range cs {
		for range 2 {
			m := c.Mutex(name)
			steps = append(steps, h.step(ctx, m, pause, func() { tokens.check(t, ctx, m.Lease) }))
		}
	}
	runSteps(t, rounds, steps)
	h.check(t, int64(len(cs)*2*rounds))
}

// rising checks that the fencing tokens of successive holds rise.
type rising struct {
	mu   sync.Mutex
	last uint64
}

func (r *rising) check(t *testing.T, ctx context.Context, lease func(context.Context) (*dsync.Lease, error)) {
	l, err := lease(ctx)
	if err != nil {
		t.Errorf("Lease: %v", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if l.Token() <= r.last {
		t.Errorf("fencing token %d after %d", l.Token(), r.last)
	}
	r.last = l.Token()
}

// minorityDown runs hammer over two quorum Clients on 5 masters, stops 2
// of them and runs it again.
func minorityDown(t *testing.T, hammer func(*testing.T, []*dsync.Quorum, string, int), rounds int) {
	ss, rdbs := masters(t, 5)
	name := redistest.Key(t)
	cs := []*dsync.Quorum{newQuorum(t, rdbs), newQuorum(t, rdbs)}
	hammer(t, cs, name, rounds)
	ss[0].Stop()
	ss[3].Stop()
	hammer(t, cs, name, rounds)
}

func TestQuorumMutexMinorityDown(t *testing.T) { minorityDown(t, hammer, 10) }

// majorityDown starts 5 masters and stops 0, 2 and 4 of them; it returns
// them, their clients and a quorum Client over all five.
func majorityDown(t *testing.T) ([]*redistest.Server, []redis.UniversalClient, *dsync.Quorum) {
	ss, rdbs := masters(t, 5)
	c := newQuorum(t, rdbs)
	for _, i := range []int{0, 2, 4} {
		ss[i].Stop()
	}
	return ss, rdbs, c
}

// tryErr turns a try into a call that fails with "granted" if it got the
// hold, and with its error otherwise.
func tryErr(f func(context.Context) (bool, error)) func(context.Context) error {
	return func(ctx context.Context) error {
		ok, err := f(ctx)
		if ok {
			return errors.New("granted")
		}
		return err
	}
}

// With 3 of 5 masters down every call of a Mutex or RWMutex fails with
// ErrNoQuorum, holds nothing and leaves nothing on the live masters; once
// a master rejoins, a hold is taken again and excludes another client.
func TestQuorumMajorityDownFails(t *testing.T) {
	type quorumHandles struct {
		m  *dsync.Mutex
		rw *dsync.RWMutex
	}
	kinds := []struct {
		name string
		// calls and leases of h, which all must fail.
		calls  func(h quorumHandles) map[string]func(context.Context) error
		leases func(h quorumHandles) map[string]func(context.Context) (*dsync.Lease, error)
		// keys that none of the live masters may have.
		keys func(name string) []string
		// again is the hold taken after a master rejoined, with its
		// release; other is another client's conflicting try.
		again func(h quorumHandles) (lock, unlock func(context.Context) error)
		other func(q *dsync.Quorum, name string) func(context.Context) (bool, error)
	}{
		{"Mutex",
			func(h quorumHandles) map[string]func(context.Context) error {
				return map[string]func(context.Context) error{"Lock": h.m.Lock, "TryLock": tryErr(h.m.TryLock)}
			},
			func(h quorumHandles) map[string]func(context.Context) (*dsync.Lease, error) {
				return map[string]func(context.Context) (*dsync.Lease, error){"Lease": h.m.Lease}
			},
			func(name string) []string { return []string{mutexKeys(name).Lock} },
			func(h quorumHandles) (func(context.Context) error, func(context.Context) error) {
				return h.m.Lock, h.m.Unlock
			},
			func(q *dsync.Quorum, name string) func(context.Context) (bool, error) { return q.Mutex(name).TryLock }},
		{"RWMutex",
			func(h quorumHandles) map[string]func(context.Context) error {
				return map[string]func(context.Context) error{
					"Lock": h.rw.Lock, "RLock": h.rw.RLock, "TryLock": tryErr(h.rw.TryLock), "TryRLock": tryErr(h.rw.TryRLock),
				}
			},
			func(h quorumHandles) map[string]func(context.Context) (*dsync.Lease, error) {
				return map[string]func(context.Context) (*dsync.Lease, error){"Lease": h.rw.Lease, "RLease": h.rw.RLease}
			},
			func(name string) []string {
				k := rwk(name)
				return []string{k.Writer, k.Readers, k.WaitingWriters, k.WaitingReaders}
			},
			func(h quorumHandles) (func(context.Context) error, func(context.Context) error) {
				return h.rw.RLock, h.rw.RUnlock
			},
			func(q *dsync.Quorum, name string) func(context.Context) (bool, error) { return q.RWMutex(name).TryLock }},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			ss, rdbs, c := majorityDown(t)
			ctx := ctxT(t)
			name := redistest.Key(t)
			h := quorumHandles{c.Mutex(name), c.RWMutex(name)}
			for what, call := range k.calls(h) {
				if err := call(ctx); !errors.Is(err, dsync.ErrNoQuorum) {
					t.Fatalf("%s with 3 of 5 masters down = %v, want ErrNoQuorum", what, err)
				}
			}
			for what, lease := range k.leases(h) {
				if _, err := lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
					t.Fatalf("%s after the failed calls = %v, want ErrNotHeld", what, err)
				}
			}
			// The two live masters hold nothing of it.
			for _, i := range []int{1, 3} {
				for _, key := range k.keys(name) {
					if n, err := rdbs[i].Exists(ctx, key).Result(); n != 0 || err != nil {
						t.Errorf("master %d: %s exists = %d, %v; want 0", i, key, n, err)
					}
				}
			}
			// A restarted master (empty) rejoins: three of five answer again.
			ss[2].Start()
			lock, unlock := k.again(h)
			if err := lock(ctx); err != nil {
				t.Fatalf("hold after a master rejoined = %v", err)
			}
			if ok, _ := k.other(newQuorum(t, rdbs), name)(ctx); ok {
				t.Fatal("another client took the name beside the hold")
			}
			if err := unlock(ctx); err != nil {
				t.Fatalf("release = %v", err)
			}
		})
	}
}

func TestQuorumMutexLeaseLostWithMajority(t *testing.T) {
	ss, rdbs := masters(t, 3)
	ctx := ctxT(t)
	m := newQuorum(t, rdbs, dsync.TTL(time.Second)).Mutex(redistest.Key(t))
	l := lockLease(t, ctx, m)
	ss[1].Stop() // one of three: still a majority
	select {
	case <-l.Done():
		t.Fatalf("lease ended with 2 of 3 masters alive: %v", l.Err())
	case <-time.After(1500 * time.Millisecond):
	}
	ss[2].Stop() // now only one of three
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease not lost with 1 of 3 masters alive")
	}
	if !errors.Is(l.Err(), dsync.ErrLeaseLost) {
		t.Fatalf("Lease.Err = %v, want ErrLeaseLost", l.Err())
	}
	if err := m.Unlock(ctx); err == nil {
		t.Fatal("Unlock of a lost quorum hold = nil, want an error")
	}
}

// Quorum mode on miniredis: exclusion, reentrancy, waking, in-process checks.
func TestQuorumMutexMiniredis(t *testing.T) {
	var rdbs []redis.UniversalClient
	for range 3 {
		rdbs = append(rdbs, redistest.Miniredis(t).NewClient(t))
	}
	ctx := dsync.WithOwner(ctxT(t))
	name := redistest.Key(t)
	c := newQuorum(t, rdbs)
	hammer(t, []*dsync.Quorum{c, newQuorum(t, rdbs)}, name, 10)

	m := c.Mutex(name)
	for range 2 {
		must(t, m.Lock(ctx))
	}
	other := newQuorum(t, rdbs).Mutex(name)
	got := make(chan error, 1)
	go func() { got <- other.Lock(ctxT(t)) }()
	for i := range 2 {
		time.Sleep(20 * time.Millisecond)
		select {
		case err := <-got:
			t.Fatalf("waiter got the lock after %d of 2 unlocks: %v", i, err)
		default:
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatalf("Unlock %d: %v", i, err)
		}
	}
	recvNil(t, got, 5*time.Second, "waiter not woken by the release")
	mustIs(t, m.Unlock(ctx), dsync.ErrNotHeld, "extra Unlock = %v, want ErrNotHeld")
}

// A Quorum has only Mutex and RWMutex: Semaphore and Once on it do not
// compile. Bad input fails every call with ErrInvalid, before any I/O.
func TestQuorumRefusesOtherPrimitives(t *testing.T) {
	qt := reflect.TypeFor[*dsync.Quorum]()
	for _, name := range []string{"Semaphore", "Once"} {
		if _, ok := qt.MethodByName(name); ok {
			t.Errorf("*Quorum has a %s method; quorum mode supports only Mutex and RWMutex", name)
		}
	}
	var methods []string
	for i := range qt.NumMethod() {
		methods = append(methods, qt.Method(i).Name)
	}
	if want := []string{"Close", "Mutex", "RWMutex"}; !slices.Equal(methods, want) {
		t.Errorf("*Quorum methods = %v, want %v", methods, want)
	}

	rdbs := []redis.UniversalClient{redistest.Miniredis(t).NewClient(t)}
	counter := &redistest.Counter{}
	rdbs[0].AddHook(counter)
	ctx := ctxT(t)
	for name, qc := range map[string]*dsync.Quorum{
		"no clients":   dsync.NewQuorum(nil),
		"nil client":   dsync.NewQuorum([]redis.UniversalClient{nil}),
		"bad option":   dsync.NewQuorum(rdbs, dsync.TTL(0)),
		"WaitReplicas": dsync.NewQuorum(rdbs, dsync.WaitReplicas(1, time.Second)),
	} {
		if err := qc.Mutex("x").Lock(ctx); !errors.Is(err, dsync.ErrInvalid) {
			t.Errorf("%s: Lock = %v, want ErrInvalid", name, err)
		}
		if err := qc.RWMutex("x").RLock(ctx); !errors.Is(err, dsync.ErrInvalid) {
			t.Errorf("%s: RLock = %v, want ErrInvalid", name, err)
		}
		qc.Close()
	}
	c := newQuorum(t, rdbs)
	checkIs(t, c.Mutex("x", dsync.WaitReplicas(1, time.Second)).Lock(ctx), dsync.ErrInvalid, "Lock of a handle with WaitReplicas = %v, want ErrInvalid")
	checkIs(t, c.RWMutex("x", dsync.WaitReplicas(1, time.Second)).Lock(ctx), dsync.ErrInvalid, "RWMutex Lock of a handle with WaitReplicas = %v, want ErrInvalid")
	if n := counter.RoundTrips(); n != 0 {
		t.Errorf("refused calls sent %d commands, want 0", n)
	}
}

// BenchmarkQuorumMutex is one uncontended Lock+Unlock over 3 and 5
// independent masters: one round trip to each master per call, in parallel.
func BenchmarkQuorumMutex(b *testing.B) {
	for _, n := range []int{3, 5} {
		b.Run("masters="+string(rune('0'+n)), func(b *testing.B) {
			counter := &redistest.Counter{}
			var rdbs []redis.UniversalClient
			for range n {
				rdb := redistest.StartStandalone(b).Client(b)
				rdb.AddHook(counter)
				rdbs = append(rdbs, rdb)
			}
			c := dsync.NewQuorum(rdbs)
			defer c.Close()
			m := c.Mutex(redistest.Key(b))
			ctx := context.Background()
			reportLockUnlock(b, counter, ctx, m.Lock, m.Unlock)
		})
	}
}

// TestQuorumFencingWithSkewedClock: one master's clock runs an hour ahead,
// so the first hold's token comes from it. After an Unlock that master goes
// away; the next hold, granted by the other two, must still get a larger
// token.
func TestQuorumFencingWithSkewedClock(t *testing.T) {
	bs := []redistest.Backend{redistest.Miniredis(t), redistest.Miniredis(t), redistest.Miniredis(t)}
	bs[0].Mini.SetTime(time.Now().Add(time.Hour))
	var rdbs []redis.UniversalClient
	for _, b := range bs {
		rdbs = append(rdbs, b.NewClient(t))
	}
	ctx := ctxT(t)
	m := newQuorum(t, rdbs).Mutex(redistest.Key(t))
	l1 := lockLease(t, ctx, m)
	must(t, m.Unlock(ctx))
	bs[0].Mini.Close() // the fast master is gone
	l2 := lockLease(t, ctx, m)
	if l2.Token() <= l1.Token() {
		t.Fatalf("token after a skewed master left = %d, want > %d", l2.Token(), l1.Token())
	}
	_ = m.Unlock(ctx)
}
