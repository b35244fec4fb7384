package dsync_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// BenchmarkRWMutexRead is one uncontended RLock+RUnlock: two round trips.
func BenchmarkRWMutexRead(b *testing.B) {
	c, counter := benchClient(b)
	rw := c.RWMutex(redistest.Key(b))
	ctx := context.Background()
	reportLockUnlock(b, counter, ctx, rw.RLock, rw.RUnlock)
}

// BenchmarkRWMutexReentry is one re-entry of an RWMutex by an owner that
// already holds it, in each reentrancy mode (mode=script, mode=client): an
// RLock+RUnlock while the owner holds a read lock (lock=read), or a
// Lock+Unlock while it holds the write lock (lock=write).
func BenchmarkRWMutexReentry(b *testing.B) {
	for _, mode := range reentrancyModes {
		for _, lock := range []string{"read", "write"} {
			b.Run("mode="+mode.name+"/lock="+lock, func(b *testing.B) {
				c, counter := benchClient(b, mode.opts...)
				rw := c.RWMutex(redistest.Key(b))
				ctx := dsync.WithOwner(context.Background())
				acquire, release := rw.RLock, rw.RUnlock
				if lock == "write" {
					acquire, release = rw.Lock, rw.Unlock
				}
				must(b, acquire(ctx))
				defer release(ctx)
				reportLockUnlock(b, counter, ctx, acquire, release)
			})
		}
	}
}

// BenchmarkRWMutexReadHeavy is a read-heavy mix, 90% reads and 10% writes,
// from 8 goroutines over 4 Clients (processes) on one name; an op is one
// lock and its unlock.
func BenchmarkRWMutexReadHeavy(b *testing.B) {
	const clients, goroutines, readPct = 4, 8, 90
	dial := benchDial(b)
	name := redistest.Key(b)
	var handles []*dsync.RWMutex
	for i := 0; i < clients; i++ {
		c := dsync.New(dial(b))
		b.Cleanup(func() { c.Close() })
		handles = append(handles, c.RWMutex(name))
	}
	ctx := context.Background()
	for _, rw := range handles { // warm up: connections, script cache
		must(b, rw.Lock(ctx))
		must(b, rw.Unlock(ctx))
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		n := b.N / goroutines
		if g < b.N%goroutines {
			n++
		}
		rw := handles[g%clients]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < n; i++ {
				lock, unlock := rw.RLock, rw.RUnlock
				if rand.IntN(100) >= readPct {
					lock, unlock = rw.Lock, rw.Unlock
				}
				if err := lock(ctx); err != nil {
					b.Error(err)
					return
				}
				if err := unlock(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
}
