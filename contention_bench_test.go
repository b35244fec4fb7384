package dsync_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"

	"github.com/dsync-go/dsync/internal/lockbench"
	"github.com/dsync-go/dsync/internal/redistest"
)

// BenchmarkDistinct is Lock+Unlock pairs over 1000 distinct names from 16
// goroutines on one Client, dsync against the raw floor (SET NX PX and a
// compare-and-delete script), and dsync with every script call sent alone
// (lib=dsync-alone: no coalescing, see maxFlight). bench/peers runs the
// same code for the peer libraries.
func BenchmarkDistinct(b *testing.B) {
	alone := lockbench.Lib{Name: "dsync-alone", Open: func(rdb redis.UniversalClient) (func(string) lockbench.Locker, func()) {
		c := dsync.New(rdb)
		dsync.SetCoalescing(c, math.MaxInt, time.Hour)
		return func(name string) lockbench.Locker { return c.Mutex(name) }, func() { c.Close() }
	}}
	for _, lib := range []lockbench.Lib{lockbench.Raw(), lockbench.Dsync(), alone} {
		b.Run("lib="+lib.Name, func(b *testing.B) {
			lockbench.Distinct(b, lib, benchDial(b), redistest.Key(b), 1000, 16)
		})
	}
}

// BenchmarkContended is one lock fought over by 8 or 32 goroutines spread
// over 4 Clients, each unlocking at once, for a fixed window per iteration
// ($DSYNC_BENCH_WINDOW, default 2s; run with -benchtime=1x): a Mutex
// (lib=dsync), the write lock of an RWMutex (lib=dsync-rwmutex) and a
// Semaphore of size 1 taken with Acquire(1) and given back with Release(1)
// (lib=dsync-semaphore). See lockbench.Contended for the metrics; violations
// must be 0.
func BenchmarkContended(b *testing.B) {
	const clients = 4
	for _, lib := range []lockbench.Lib{lockbench.Dsync(), lockbench.DsyncRWMutex(), lockbench.DsyncSemaphore()} {
		for _, g := range []int{8, 32} {
			b.Run(fmt.Sprintf("lib=%s/G=%d", lib.Name, g), func(b *testing.B) {
				lockbench.Contended(b, lib, benchDial(b), redistest.Key(b), clients, g)
			})
		}
	}
}
