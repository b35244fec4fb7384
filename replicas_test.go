package dsync_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// Without replicas WAIT acknowledges nothing: the Lock fails and leaves no
// hold behind.
func TestWaitReplicasWithoutReplicasFails(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		m := newClient(t, b, dsync.WaitReplicas(1, 10*time.Millisecond)).Mutex(name)
		mustIs(t, m.Lock(ctx), dsync.ErrNotReplicated, "Lock = %v, want ErrNotReplicated")
		if _, err := m.Lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
			t.Errorf("Lease after the failed Lock = %v, want ErrNotHeld", err)
		}
		if ok, err := newClient(t, b).Mutex(name).TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock by another client = %v, %v; want the lock free", ok, err)
		}
		// WaitReplicas(0, ...) waits for nothing.
		if err := newClient(t, b, dsync.WaitReplicas(0, 0)).Mutex(redistest.Key(t)).Lock(ctx); err != nil {
			t.Fatalf("Lock with WaitReplicas(0) = %v", err)
		}
	})
}

func TestWaitReplicasBadInput(t *testing.T) {
	b := redistest.Miniredis(t)
	ctx := ctxT(t)
	for _, o := range []dsync.Option{dsync.WaitReplicas(-1, time.Second), dsync.WaitReplicas(1, 0)} {
		checkIs(t, newClient(t, b, o).Mutex("x").Lock(ctx), dsync.ErrInvalid, "Lock = %v, want ErrInvalid")
	}
}

// Every primitive's acquire honours WaitReplicas, and a failed one leaves
// nothing held.
func TestWaitReplicasEveryPrimitive(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b, dsync.WaitReplicas(1, 10*time.Millisecond))
		free := newClient(t, b)
		rw := c.RWMutex(name)
		checkIs(t, rw.Lock(ctx), dsync.ErrNotReplicated, "RWMutex.Lock = %v, want ErrNotReplicated")
		checkIs(t, rw.RLock(ctx), dsync.ErrNotReplicated, "RWMutex.RLock = %v, want ErrNotReplicated")
		if ok, err := free.RWMutex(name).TryLock(ctx); !ok || err != nil {
			t.Errorf("RWMutex left held: TryLock = %v, %v", ok, err)
		}
		sem := c.Semaphore(name, 2)
		checkIs(t, sem.Acquire(ctx, 1), dsync.ErrNotReplicated, "Semaphore.Acquire = %v, want ErrNotReplicated")
		if ok, err := free.Semaphore(name, 2).TryAcquire(ctx, 2); !ok || err != nil {
			t.Errorf("Semaphore permits left taken: TryAcquire(2) = %v, %v", ok, err)
		}
		ran := false
		err := c.Once(name).Do(ctx, func(context.Context) error { ran = true; return nil })
		if !errors.Is(err, dsync.ErrNotReplicated) || ran {
			t.Errorf("Once.Do = %v (f ran: %v), want ErrNotReplicated before f", err, ran)
		}
		if err := free.Once(name).Do(ctx, func(context.Context) error { return nil }); err != nil {
			t.Errorf("Once left held: Do = %v", err)
		}
	})
}

// masterWithReplica starts a redis-server and a replica of it, synced, and
// returns clients of each.
func masterWithReplica(t *testing.T) (master, replica redis.UniversalClient) {
	t.Helper()
	m, r := redistest.StartStandalone(t), redistest.StartStandalone(t)
	ctx := context.Background()
	master, replica = m.Client(t), r.Client(t)
	port := strings.TrimPrefix(m.Addr(), "127.0.0.1:")
	must(t, replica.Do(ctx, "REPLICAOF", "127.0.0.1", port).Err())
	waitFor(t, 15*time.Second, "the replica syncs", func() bool {
		n, err := master.Do(ctx, "WAIT", 1, 100).Int64()
		info, _ := replica.Info(ctx, "replication").Result()
		return err == nil && n >= 1 && strings.Contains(info, "master_link_status:up")
	})
	return master, replica
}

// With a live replica every primitive's acquire with WaitReplicas succeeds
// (none panics), and what it took is on the replica when it returns.
func TestWaitReplicasEveryPrimitiveWithALiveReplica(t *testing.T) {
	master, replica := masterWithReplica(t)
	c := dsync.New(master, dsync.WaitReplicas(1, 5*time.Second))
	t.Cleanup(func() { c.Close() })
	ctx := ctxT(t)
	onReplica := func(what, key string) {
		t.Helper()
		if n, err := replica.Exists(ctx, key).Result(); n != 1 || err != nil {
			t.Errorf("%s: %s on the replica = %d, %v when the call returned; want it there", what, key, n, err)
		}
	}
	name := redistest.Key(t)
	m := c.Mutex(name)
	must(t, m.Lock(ctx))
	onReplica("Mutex.Lock", mutexKeys(name).Lock)
	must(t, m.Unlock(ctx))
	rw := c.RWMutex(name + "rw")
	must(t, rw.Lock(ctx))
	onReplica("RWMutex.Lock", rwk(name+"rw").Writer)
	must(t, rw.Unlock(ctx))
	must(t, rw.RLock(ctx))
	onReplica("RWMutex.RLock", rwk(name+"rw").Readers)
	must(t, rw.RUnlock(ctx))
	s := c.Semaphore(name+"s", 2)
	must(t, s.Acquire(ctx, 1))
	onReplica("Semaphore.Acquire", semKeys(name+"s").Holders)
	must(t, s.Release(ctx, 1))
	ran := false
	must(t, c.Once(name+"o").Do(ctx, func(context.Context) error { ran = true; return nil }))
	if !ran {
		t.Error("Once.Do with a live replica did not run f")
	}
}
