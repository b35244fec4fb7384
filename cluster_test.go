package dsync_test

import (
	"context"
	"strconv"
	"strings"
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
