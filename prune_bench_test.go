package dsync_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// BenchmarkPruneBacklog puts 50,000 call ids whose replay window has ended
// in a Mutex's ids zset (what a name taken 5,000 times a second gathers
// between two prunes) and runs Lock+Unlock pairs until they are gone. It
// reports the longest script (max-script-µs, by SLOWLOG: the time the
// server served no other client) and how many scripts pruned them
// (scripts). Run it with -benchtime 1x.
func BenchmarkPruneBacklog(b *testing.B) {
	const backlog = 50000
	ctx := context.Background()
	rdb := benchDial(b)(b)
	if _, ok := rdb.(*redis.ClusterClient); ok {
		b.Skip("SLOWLOG is read from one server")
	}
	c, _ := benchClient(b, dsync.FixedLease())
	keepSlowlog(b, rdb)
	must := func(err error) {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
	}
	var longest time.Duration
	scripts := 0
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("%s:%d", redistest.Key(b), i)
		m := c.Mutex(name)
		ids := mutexKeys(name).Calls
		now, err := rdb.Time(ctx).Result()
		must(err)
		score := float64(now.Add(-time.Second).UnixMilli() * 4)
		for j := 0; j < backlog; j += 1000 {
			zs := make([]redis.Z, 1000)
			for k := range zs {
				zs[k] = redis.Z{Score: score, Member: fmt.Sprintf("old%07d", j+k)}
			}
			must(rdb.ZAdd(ctx, ids, zs...).Err())
		}
		must(rdb.PExpire(ctx, ids, time.Minute).Err())
		must(rdb.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err())
		must(rdb.SlowLogReset(ctx).Err())
		for k := 0; k < backlog/100; k++ {
			must(m.Lock(ctx))
			must(m.Unlock(ctx))
			scripts += 2
			n, err := rdb.ZCount(ctx, ids, "-inf", fmt.Sprintf("%.0f", score)).Result()
			must(err)
			if n == 0 {
				break
			}
		}
		must(rdb.ConfigSet(ctx, "slowlog-log-slower-than", "-1").Err())
		log, err := rdb.SlowLogGet(ctx, 16384).Result()
		must(err)
		for _, e := range log {
			if len(e.Args) > 0 && strings.EqualFold(e.Args[0], "evalsha") && e.Duration > longest {
				longest = e.Duration
			}
		}
	}
	b.ReportMetric(float64(longest.Microseconds()), "max-script-µs")
	b.ReportMetric(float64(scripts)/float64(b.N), "scripts")
}
