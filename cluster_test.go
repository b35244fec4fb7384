package dsync_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
	"github.com/dsync-go/dsync/internal/redistest"
)

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
			ch := keys.ForMutex(dsync.DefaultPrefix, redistest.Key(b)).Channel()
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
				must(b, rdb.Do(ctx, cmd, ch, "").Err())
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
		must(b, holder.Lock(ctx))
		got := make(chan time.Time, 1)
		go func() {
			if err := waiter.Lock(ctx); err != nil {
				b.Error(err)
			}
			got <- time.Now()
		}()
		time.Sleep(5 * time.Millisecond)
		released := time.Now()
		must(b, holder.Unlock(ctx))
		total += (<-got).Sub(released)
		must(b, waiter.Unlock(ctx))
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N), "µs-wakeup/op")
}

// TestClusterWaiterSubscribesOnTheNamesMaster: on a Redis Cluster a
// waiter's channels are subscribed on the master whose slots the name
// hashes to, where the release script publishes, so that a notification
// does not cross the cluster bus (whose connections can hold a small
// message about 40 ms: docs/scaling.md). Names on every master are tried;
// PUBSUB NUMSUB answers for the node it is sent to.
func TestClusterWaiterSubscribesOnTheNamesMaster(t *testing.T) {
	be, ok := redistest.Cluster(t)
	if !ok {
		t.Skip("needs redis-server and redis-cli")
	}
	t.Parallel()
	ctx := ctxT(t)
	rdb := be.NewClient(t).(*redis.ClusterClient)
	holders, waiters := newClient(t, be), newClient(t, be)
	// Names until every master owns one.
	masters := map[string]string{} // master address -> a name it owns
	base := redistest.Key(t)
	for i := 0; len(masters) < 3 && i < 1000; i++ {
		name := base + ":" + strconv.Itoa(i)
		m, err := rdb.MasterForKey(ctx, mutexKeys(name).Lock)
		must(t, err)
		if _, ok := masters[m.Options().Addr]; !ok {
			masters[m.Options().Addr] = name
		}
	}
	if len(masters) < 3 {
		t.Fatalf("names found on %d masters, want 3", len(masters))
	}
	done := make(chan error, len(masters))
	held := map[string]*dsync.Mutex{}
	for _, name := range masters {
		held[name] = holders.Mutex(name)
		must(t, held[name].Lock(ctx))
		w := waiters.Mutex(name)
		go func() {
			if err := w.Lock(ctx); err != nil {
				done <- err
				return
			}
			done <- w.Unlock(ctx)
		}()
	}
	for addr, name := range masters {
		ch := mutexKeys(name).Channel()
		waitFor(t, 10*time.Second, "the waiter's subscription of "+name, func() bool {
			var (
				mu sync.Mutex
				on []string
			)
			err := rdb.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
				n, err := c.PubSubNumSub(ctx, ch).Result()
				if err != nil {
					return err
				}
				if n[ch] > 0 {
					mu.Lock()
					on = append(on, c.Options().Addr)
					mu.Unlock()
				}
				return nil
			})
			must(t, err)
			if len(on) > 1 || (len(on) == 1 && on[0] != addr) {
				t.Fatalf("channel of %s subscribed on %v, want only its master %s", name, on, addr)
			}
			return len(on) == 1
		})
	}
	for _, m := range held {
		must(t, m.Unlock(ctx))
	}
	for range masters {
		select {
		case err := <-done:
			must(t, err)
		case <-ctx.Done():
			t.Fatal("a waiter did not get its lock")
		}
	}
}

// TestClusterWaitersSurvivePubSubKill: on a Redis Cluster every master
// drops the waiting Client's pub/sub connections (CLIENT KILL by id, found
// by the client name) while a waiter sleeps on a name of each master; each
// link reconnects and subscribes again, and the releases that follow wake
// the waiters at once, not after the 30 s TTL.
func TestClusterWaitersSurvivePubSubKill(t *testing.T) {
	be, ok := redistest.Cluster(t)
	if !ok {
		t.Skip("needs redis-server and redis-cli")
	}
	t.Parallel()
	ctx := ctxT(t)
	admin := be.NewClient(t).(*redis.ClusterClient)
	clientName := "dsync-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                      be.Addrs,
		ClientName:                 clientName,
		ClusterStateReloadInterval: time.Second,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	waiters := dsync.New(rdb)
	t.Cleanup(func() { waiters.Close() })
	holders := newClient(t, be)

	masters := map[string]string{} // master address -> a name it owns
	base := redistest.Key(t)
	for i := 0; len(masters) < 3 && i < 1000; i++ {
		name := base + ":" + strconv.Itoa(i)
		m, err := admin.MasterForKey(ctx, mutexKeys(name).Lock)
		must(t, err)
		if _, ok := masters[m.Options().Addr]; !ok {
			masters[m.Options().Addr] = name
		}
	}
	if len(masters) < 3 {
		t.Fatalf("names found on %d masters, want 3", len(masters))
	}
	held := map[string]*dsync.Mutex{}
	waiting := map[string]*dsync.Mutex{}
	got := map[string]<-chan error{}
	for _, name := range masters {
		held[name] = holders.Mutex(name)
		must(t, held[name].Lock(ctx))
		w := waiters.Mutex(name)
		waiting[name] = w
		got[name] = async(func() error { return w.Lock(ctx) })
	}
	// subscribed reports whether the channel of name has a subscriber on
	// the master at addr.
	subscribed := func(addr, name string) bool {
		var n int64
		err := admin.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			if c.Options().Addr != addr {
				return nil
			}
			ch := mutexKeys(name).Channel()
			m, err := c.PubSubNumSub(ctx, ch).Result()
			n = m[ch]
			return err
		})
		must(t, err)
		return n > 0
	}
	for addr, name := range masters {
		waitFor(t, 10*time.Second, "the subscription of "+name, func() bool { return subscribed(addr, name) })
	}
	// Kill the waiting Client's pub/sub connections on every master.
	var killed atomic.Int64
	must(t, admin.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		list, err := c.ClientList(ctx).Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(list, "\n") {
			if !strings.Contains(line, " name="+clientName+" ") || !strings.Contains(line, " sub=") || strings.Contains(line, " sub=0 ") {
				continue
			}
			id, _, _ := strings.Cut(strings.TrimPrefix(line, "id="), " ")
			if err := c.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
				return err
			}
			killed.Add(1)
		}
		return nil
	}))
	if killed.Load() < 3 {
		t.Fatalf("killed %d pub/sub connections, want one per master (3)", killed.Load())
	}
	// Each link subscribes again on its master.
	for addr, name := range masters {
		waitFor(t, 10*time.Second, "the subscription of "+name+" after the kill", func() bool { return subscribed(addr, name) })
	}
	for name, m := range held {
		released := time.Now()
		must(t, m.Unlock(ctx))
		gotLockSoon(t, got[name], released, 10*time.Second, 2*time.Second, "the release of "+name)
		must(t, waiting[name].Unlock(ctx))
	}
}
