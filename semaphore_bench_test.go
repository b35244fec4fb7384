package dsync_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// BenchmarkSemaphore measures, on the real server:
//
//   - op=uncontended: one Acquire(1)+Release(1) with nothing else going on,
//     two round trips (one script each);
//   - op=contended: 8 goroutines over 4 Clients sharing a semaphore of size
//     4, each Acquire of 1 or 2 permits followed at once by its Release;
//     b.N counts Acquire+Release pairs over all goroutines.
func BenchmarkSemaphore(b *testing.B) {
	b.Run("op=uncontended", func(b *testing.B) {
		c, counter := benchClient(b)
		s := c.Semaphore(redistest.Key(b), 4)
		ctx := context.Background()
		reportRoundTrips(b, counter, func() {
			must(b, s.Acquire(ctx, 1))
			must(b, s.Release(ctx, 1))
		})
	})
	b.Run("op=contended", func(b *testing.B) {
		const clients, goroutines, size = 4, 8, 4
		name := redistest.Key(b)
		counters := make([]*redistest.Counter, clients)
		sems := make([]*dsync.Semaphore, goroutines)
		for i := range clients {
			var c *dsync.Client
			c, counters[i] = benchClient(b)
			sems[i] = c.Semaphore(name, size)
			sems[i+clients] = c.Semaphore(name, size)
		}
		ctx := context.Background()
		var next atomic.Int64
		var wg sync.WaitGroup
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for _, s := range sems {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(b.N) {
					n := int64(1 + rand.IntN(2))
					if err := s.Acquire(ctx, n); err != nil {
						b.Error(err)
						return
					}
					if err := s.Release(ctx, n); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		var trips int64
		for _, c := range counters {
			trips += c.RoundTrips()
		}
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
		b.ReportMetric(float64(trips)/float64(b.N), "roundtrips/op")
	})
}
