package dsync_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/lockbench"
	"github.com/dsync-go/dsync/internal/redistest"
)

// benchDial returns a dialer for the server the benchmarks run on: the
// cluster named by $DSYNC_BENCH_CLUSTER_ADDRS or the server named by
// $DSYNC_BENCH_REDIS_ADDR (bench/run.sh starts them), else the test
// helper's real server. It skips when there is none: timings on miniredis
// say nothing about round trips.
func benchDial(b *testing.B) lockbench.Dial {
	b.Helper()
	if dial, ok := lockbench.EnvDial(); ok {
		return dial
	}
	be, ok := redistest.Real(b)
	if !ok {
		b.Skip("benchmarks need redis-server on PATH")
	}
	return be.NewClient
}

// benchClient returns a Client on the real server with a round-trip counter,
// or skips: timings on miniredis say nothing about round trips.
func benchClient(b *testing.B, opts ...dsync.Option) (*dsync.Client, *redistest.Counter) {
	b.Helper()
	rdb := benchDial(b)(b)
	counter := redistest.Count(rdb)
	c := dsync.New(rdb, opts...)
	b.Cleanup(func() { c.Close() })
	return c, counter
}

// reportRoundTrips warms up, runs op b.N times and reports round trips per op.
func reportRoundTrips(b *testing.B, counter *redistest.Counter, op func()) {
	b.Helper()
	op() // warm up: connections, script cache
	counter.Reset()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		op()
	}
	b.StopTimer()
	b.ReportMetric(float64(counter.RoundTrips())/float64(b.N), "roundtrips/op")
}

// reportLockUnlock is reportRoundTrips of one lock and its unlock.
func reportLockUnlock(b *testing.B, counter *redistest.Counter, ctx context.Context, lock, unlock func(context.Context) error) {
	b.Helper()
	reportRoundTrips(b, counter, func() {
		must(b, lock(ctx))
		must(b, unlock(ctx))
	})
}

// BenchmarkMutex is one uncontended Lock+Unlock: two round trips.
func BenchmarkMutex(b *testing.B) {
	c, counter := benchClient(b)
	m := c.Mutex(redistest.Key(b))
	ctx := context.Background()
	reportLockUnlock(b, counter, ctx, m.Lock, m.Unlock)
}

// BenchmarkMutexCancelCtx is BenchmarkMutex with a ctx that can be
// cancelled, as a request's is: each command then runs in a goroutine of
// its own, so that the call returns when ctx ends whatever go-redis does.
func BenchmarkMutexCancelCtx(b *testing.B) {
	c, counter := benchClient(b)
	m := c.Mutex(redistest.Key(b))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reportLockUnlock(b, counter, ctx, m.Lock, m.Unlock)
}

// BenchmarkRawFloor is the floor for a correct lock: SET NX PX and a
// compare-and-delete script, two round trips.
func BenchmarkRawFloor(b *testing.B) {
	rdb := benchDial(b)(b)
	counter := redistest.Count(rdb)
	key := redistest.Key(b)
	del := redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)
	ctx := context.Background()
	reportRoundTrips(b, counter, func() {
		if ok, err := rdb.SetNX(ctx, key, "token", 30e9).Result(); !ok || err != nil {
			b.Fatal(ok, err)
		}
		must(b, del.Run(ctx, rdb, []string{key}, "token").Err())
	})
}

// BenchmarkMutexFixed is BenchmarkMutex on a Client with FixedLease (no
// renewal): two round trips.
func BenchmarkMutexFixed(b *testing.B) {
	c, counter := benchClient(b, dsync.FixedLease())
	m := c.Mutex(redistest.Key(b))
	ctx := context.Background()
	reportLockUnlock(b, counter, ctx, m.Lock, m.Unlock)
}

// reentrancyModes are the reentrancy modes the re-entry benchmarks run in:
// script (the default, the count lives in Redis) and client
// (dsync.ClientReentrancy, the count lives in the process).
var reentrancyModes = []struct {
	name string
	opts []dsync.Option
}{
	{"script", nil},
	{"client", []dsync.Option{dsync.ClientReentrancy()}},
}

// BenchmarkMutexReentry is one re-entry (Lock+Unlock by an owner that
// already holds the lock) in each reentrancy mode.
func BenchmarkMutexReentry(b *testing.B) {
	for _, mode := range reentrancyModes {
		b.Run("mode="+mode.name, func(b *testing.B) {
			c, counter := benchClient(b, mode.opts...)
			m := c.Mutex(redistest.Key(b))
			ctx := dsync.WithOwner(context.Background())
			must(b, m.Lock(ctx))
			defer m.Unlock(ctx)
			reportLockUnlock(b, counter, ctx, m.Lock, m.Unlock)
		})
	}
}

// BenchmarkRWMutexWrite is one uncontended Lock+Unlock of an RWMutex: two
// round trips.
func BenchmarkRWMutexWrite(b *testing.B) {
	c, counter := benchClient(b)
	rw := c.RWMutex(redistest.Key(b))
	ctx := context.Background()
	reportLockUnlock(b, counter, ctx, rw.Lock, rw.Unlock)
}

// BenchmarkOnceDone is Once.Do on a name that is already done: one round
// trip, and f is not called.
func BenchmarkOnceDone(b *testing.B) {
	c, counter := benchClient(b)
	o := c.Once(redistest.Key(b))
	ctx := context.Background()
	must(b, o.Do(ctx, func(context.Context) error { return nil }))
	f := func(context.Context) error {
		b.Fatal("f called on a done Once")
		return nil
	}
	reportRoundTrips(b, counter, func() {
		must(b, o.Do(ctx, f))
	})
}

// BenchmarkMutexScriptFloor is the floor of a Mutex pair made of one
// script a call, as dsync's is: the EVALSHAs of one Lock and its Unlock,
// with exactly the keys and arguments dsync sent, run against scripts that
// return at once (with a reply of the same shape). What dsync's pair costs
// beyond it is what its scripts do on the server; what this costs beyond
// BenchmarkRawFloor is the larger commands and the script start.
func BenchmarkMutexScriptFloor(b *testing.B) {
	rdb := benchDial(b)(b)
	rec := &redistest.Recorder{}
	rdb.AddHook(rec)
	c := dsync.New(rdb)
	b.Cleanup(func() { c.Close() })
	m := c.Mutex(redistest.Key(b))
	ctx := context.Background()
	must(b, m.Lock(ctx)) // loads the scripts
	must(b, m.Unlock(ctx))
	rec.Reset()
	must(b, m.Lock(ctx))
	must(b, m.Unlock(ctx))
	var calls [2]struct {
		keys []string
		args []any
	}
	sent := rec.All()
	if len(sent) != 2 {
		b.Fatalf("a Lock and its Unlock sent %d scripts, want 2", len(sent))
	}
	for i, a := range sent {
		// EVALSHA sha numkeys key... arg...
		n, err := strconv.Atoi(fmt.Sprint(a[2]))
		if err != nil || 3+n > len(a) {
			b.Fatalf("script %d sent as %v", i, a)
		}
		for _, k := range a[3 : 3+n] {
			calls[i].keys = append(calls[i].keys, fmt.Sprint(k))
		}
		calls[i].args = a[3+n:]
	}
	lock := redis.NewScript(`return {1, 1}`)
	unlock := redis.NewScript(`return 1`)
	for _, s := range []*redis.Script{lock, unlock} {
		must(b, s.Load(ctx, rdb).Err())
	}
	counter := redistest.Count(rdb)
	reportRoundTrips(b, counter, func() {
		for i, s := range []*redis.Script{lock, unlock} {
			must(b, s.EvalSha(ctx, rdb, calls[i].keys, calls[i].args...).Err())
		}
	})
}
