package renew_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/renew"
)

// BenchmarkTick10000 measures one renewal pass over 10,000 holds on one
// Renewer against a real redis-server: round trips and time per pass, and
// the renewer's heap per hold.
func BenchmarkTick10000(b *testing.B) {
	for _, batch := range []*redis.Script{nil, batchScript} {
		name := "batch=none"
		if batch != nil {
			name = "batch=script"
		}
		b.Run(name, func(b *testing.B) { benchTick(b, batch) })
	}
}

func benchTick(b *testing.B, batch *redis.Script) {
	const (
		holds = 10000
		ttl   = 30 * time.Second
	)
	addr, _ := startRedisServer(b)
	if addr == "" {
		b.Skip("redis-server not on PATH: benchmark needs a real server")
	}
	cnt := &counter{}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	rdb.AddHook(cnt)
	ctx := context.Background()

	specs := make([]renew.Spec, holds)
	start := time.Now()
	pipe := rdb.Pipeline()
	for i := range specs {
		key := fmt.Sprintf("bench:{lock-%d}", i)
		owner := fmt.Sprintf("owner-%d", i)
		specs[i] = renew.Spec{Script: script, Batch: batch, Keys: []string{key},
			Args: []any{owner, ttl.Milliseconds()}, TTL: ttl, Start: start}
		pipe.Set(ctx, key, owner, ttl)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatalf("SET: %v", err)
	}

	r := renew.New(rdb) // default BatchSize: 1000
	defer r.Close()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	hs := make([]*renew.Hold, holds)
	for i, s := range specs {
		hs[i] = r.Add(s)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perHold := float64(after.HeapAlloc-before.HeapAlloc) / holds

	renew.RenewAllNow(r) // loads the script and warms the connection
	if got := r.Len(); got != holds {
		b.Fatalf("Len() = %d after warm-up, want %d", got, holds)
	}

	b.ReportAllocs()
	b.ResetTimer()
	trips := cnt.total()
	for b.Loop() {
		renew.RenewAllNow(r)
	}
	b.StopTimer()
	trips = cnt.total() - trips

	if got := r.Len(); got != holds {
		b.Fatalf("Len() = %d, want %d: holds were lost", got, holds)
	}
	b.ReportMetric(float64(trips)/float64(b.N), "roundtrips/tick")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/tick")
	b.ReportMetric(perHold, "B/hold")
	runtime.KeepAlive(hs)
	runtime.KeepAlive(specs)
}
