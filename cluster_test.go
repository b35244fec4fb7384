package dsync_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// eachBackendAll runs f on miniredis and, when available, a real
// redis-server and a real 3-master Redis Cluster.
func eachBackendAll(t *testing.T, f func(t *testing.T, b redistest.Backend)) {
	for _, b := range redistest.AllBackends(t) {
		t.Run(b.Name, func(t *testing.T) { f(t, b) })
	}
}

// The key Mutex behaviours again, on every backend including the cluster.

func TestClusterMutexExcludesAcrossClients(t *testing.T) {
	eachBackendAll(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		const clients, perClient, rounds = 3, 2, 15
		var inside, maxInside, total atomic.Int64
		var wg sync.WaitGroup
		for range clients {
			c := newClient(t, b)
			for range perClient {
				m := c.Mutex(name)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range rounds {
						if err := m.Lock(ctx); err != nil {
							t.Errorf("Lock: %v", err)
							return
						}
						n := inside.Add(1)
						if n > maxInside.Load() {
							maxInside.Store(n)
						}
						total.Add(1)
						time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
						inside.Add(-1)
						if err := m.Unlock(ctx); err != nil {
							t.Errorf("Unlock: %v", err)
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		if got := maxInside.Load(); got != 1 {
			t.Errorf("holders at once = %d, want 1", got)
		}
		if got, want := total.Load(), int64(clients*perClient*rounds); got != want {
			t.Errorf("acquisitions = %d, want %d", got, want)
		}
		assertNoLockKeys(t, b, name)
	})
}

func TestClusterMutexTryLock(t *testing.T) {
	eachBackendAll(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		m1, m2 := newClient(t, b).Mutex(name), newClient(t, b).Mutex(name)
		if ok, err := m1.TryLock(ctx); !ok || err != nil {
			t.Fatalf("first TryLock = %v, %v; want true, nil", ok, err)
		}
		if ok, err := m2.TryLock(ctx); ok || err != nil {
			t.Fatalf("TryLock while held = %v, %v; want false, nil", ok, err)
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
		if err := m2.Unlock(ctx); !errors.Is(err, dsync.ErrNotHeld) {
			t.Fatalf("second Unlock = %v, want ErrNotHeld", err)
		}
	})
}

func TestClusterMutexReentrantOwner(t *testing.T) {
	eachBackendAll(t, func(t *testing.T, b redistest.Backend) {
		ctx := dsync.WithOwner(ctxT(t))
		name := redistest.Key(t)
		m := newClient(t, b).Mutex(name)
		other := newClient(t, b).Mutex(name)
		octx := dsync.WithOwner(context.Background())
		for i := range 3 {
			if err := m.Lock(ctx); err != nil {
				t.Fatalf("Lock %d: %v", i, err)
			}
		}
		rdb := b.NewClient(t)
		if n, _ := rdb.HGet(ctx, "dsync:{"+name+"}", dsync.OwnerToken(ctx)).Int(); n != 3 {
			t.Errorf("reentry count in Redis = %d, want 3", n)
		}
		for i := range 3 {
			if ok, _ := other.TryLock(octx); ok {
				t.Fatalf("another owner took the lock after %d of 3 unlocks", i)
			}
			if err := m.Unlock(ctx); err != nil {
				t.Fatalf("Unlock %d: %v", i, err)
			}
		}
		if ok, err := other.TryLock(octx); !ok || err != nil {
			t.Fatalf("TryLock after the last Unlock = %v, %v", ok, err)
		}
		if err := other.Unlock(octx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestClusterMutexWaiterWokenByRelease(t *testing.T) {
	eachBackendAll(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		holder := newClient(t, b).Mutex(name)
		waiter := newClient(t, b).Mutex(name)
		const rounds = 10
		var lat []time.Duration
		for range rounds {
			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			got := make(chan time.Time, 1)
			go func() {
				if err := waiter.Lock(ctx); err != nil {
					t.Error(err)
				}
				got <- time.Now()
			}()
			time.Sleep(20 * time.Millisecond) // let the waiter block
			released := time.Now()
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			lat = append(lat, (<-got).Sub(released))
			if err := waiter.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		slices.Sort(lat)
		med := lat[len(lat)/2]
		t.Logf("wake-up latency: median %v, max %v", med, lat[len(lat)-1])
		// The TTL is 30 s: only a notification explains a fast wake-up.
		if med > 50*time.Millisecond {
			t.Errorf("median wake-up %v, want under 50ms", med)
		}
	})
}

func TestClusterMutexCancelLeavesNothing(t *testing.T) {
	eachBackendAll(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		holder := newClient(t, b).Mutex(name)
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		c := newClient(t, b)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				wctx, cancel := context.WithTimeout(ctx, time.Duration(1+rand.IntN(40))*time.Millisecond)
				defer cancel()
				if i%2 == 0 {
					wctx = dsync.WithOwner(wctx)
				}
				m := c.Mutex(name)
				if err := m.Lock(wctx); err == nil {
					if err := m.Unlock(wctx); err != nil {
						t.Errorf("Unlock: %v", err)
					}
				} else if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Lock = %v, want DeadlineExceeded", err)
				}
			}()
		}
		time.Sleep(20 * time.Millisecond)
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if ok, err := newClient(t, b).Mutex(name).TryLock(ctx); !ok || err != nil {
			t.Fatalf("TryLock after every waiter gave up = %v, %v; want true", ok, err)
		}
	})
}

func TestClusterMutexLostReplyIsReleased(t *testing.T) {
	eachBackendAll(t, func(t *testing.T, b redistest.Backend) {
		ctx := ctxT(t)
		name := redistest.Key(t)
		rdb := b.NewClient(t)
		faults := &redistest.Faults{}
		rdb.AddHook(faults)
		c := dsync.New(rdb)
		defer c.Close()
		faults.DropReplyNext(1, context.DeadlineExceeded)
		if err := c.Mutex(name).Lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock = %v, want the injected error", err)
		}
		if ok, err := newClient(t, b).Mutex(name).TryLock(ctx); !ok || err != nil {
			t.Fatalf("lock leaked after a lost reply: TryLock = %v, %v", ok, err)
		}
	})
}

// BenchmarkClusterNotify measures one notification on the cluster as the
// notifier receives it: publish, then wait for the message. cmd=publish is
// what dsync sends (PUBLISH, which Redis Cluster forwards to every node over
// the cluster bus); cmd=spublish is sharded pub/sub (SPUBLISH/SSUBSCRIBE,
// Redis 7), which stays within the channel's shard. busmsgs/op counts the
// cluster-bus publish messages all nodes received.
func BenchmarkClusterNotify(b *testing.B) {
	be, ok := redistest.Cluster(b)
	if !ok {
		b.Skip("needs redis-server and redis-cli")
	}
	rdb := be.NewClient(b).(*redis.ClusterClient)
	ctx := context.Background()
	busMsgs := func() int64 {
		var n atomic.Int64
		_ = rdb.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
			info, err := c.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			for _, l := range strings.Split(info, "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(l), "cluster_stats_messages_publish_received:"); ok {
					k, _ := strconv.ParseInt(v, 10, 64)
					n.Add(k)
				}
			}
			return nil
		})
		return n.Load()
	}
	for _, cmd := range []string{"publish", "spublish"} {
		b.Run("cmd="+cmd, func(b *testing.B) {
			ch := "dsync:{" + redistest.Key(b) + "}"
			var ps *redis.PubSub
			if cmd == "publish" {
				ps = rdb.Subscribe(ctx, ch)
			} else {
				ps = rdb.SSubscribe(ctx, ch)
			}
			defer ps.Close()
			if _, err := ps.Receive(ctx); err != nil {
				b.Fatal(err)
			}
			msgs := ps.Channel()
			send := func() {
				if err := rdb.Do(ctx, cmd, ch, "").Err(); err != nil {
					b.Fatal(err)
				}
				select {
				case <-msgs:
				case <-time.After(5 * time.Second):
					b.Fatal("no message")
				}
			}
			send()
			before := busMsgs()
			b.ResetTimer()
			for range b.N {
				send()
			}
			b.StopTimer()
			b.ReportMetric(float64(busMsgs()-before)/float64(b.N), "busmsgs/op")
		})
	}
}

// BenchmarkClusterMutexWakeup is the time from a release to the waiter
// holding the lock on the cluster: the unlock script's notification and the
// waiter's acquire.
func BenchmarkClusterMutexWakeup(b *testing.B) {
	be, ok := redistest.Cluster(b)
	if !ok {
		b.Skip("needs redis-server and redis-cli")
	}
	ctx := context.Background()
	name := redistest.Key(b)
	c1, c2 := dsync.New(be.NewClient(b)), dsync.New(be.NewClient(b))
	defer c1.Close()
	defer c2.Close()
	holder, waiter := c1.Mutex(name), c2.Mutex(name)
	var total time.Duration
	for range b.N {
		if err := holder.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			if err := waiter.Lock(ctx); err != nil {
				b.Error(err)
			}
			got <- time.Now()
		}()
		time.Sleep(5 * time.Millisecond)
		released := time.Now()
		if err := holder.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		total += (<-got).Sub(released)
		if err := waiter.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-wakeup/op")
}
