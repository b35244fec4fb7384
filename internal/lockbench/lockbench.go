// Package lockbench holds the lock benchmarks that dsync and the peer
// libraries (bench/peers) run alike, so that every library is measured by
// the same code in the same run: uncontended Lock+Unlock pairs, pairs on
// many distinct names, and contended hand-off of one name. dsync's RWMutex
// (write lock) and Semaphore (size 1) are wrapped as lockers too, so that
// their contended hand-off is measured by the same code as the Mutex's.
package lockbench

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A Locker is one handle on one lock name, used by one goroutine at a time.
type Locker interface {
	Lock(ctx context.Context) error
	Unlock(ctx context.Context) error
}

// A Lib is a lock library under test.
type Lib struct {
	Name string
	// Open wraps one go-redis client (one "process") and returns a maker
	// of handles on it and a function that releases what Open made.
	Open func(rdb redis.UniversalClient) (handle func(name string) Locker, close func())
}

// Dial returns a new go-redis client on the server under test, closed by
// the benchmark's cleanup.
type Dial func(tb testing.TB) redis.UniversalClient

// AddrEnv names the environment variable that points the benchmarks at a
// running server (host:port), as bench/run.sh does.
const AddrEnv = "DSYNC_BENCH_REDIS_ADDR"

// ClusterEnv names the environment variable that points the benchmarks at a
// running Redis Cluster instead (its nodes' host:port, comma-separated), as
// CLUSTER=1 bench/run.sh does. It takes precedence over AddrEnv.
const ClusterEnv = "DSYNC_BENCH_CLUSTER_ADDRS"

// clusterReload is the ClusterStateReloadInterval of the benchmarks'
// cluster clients (go-redis's default is a minute).
const clusterReload = time.Second

// WindowEnv names the environment variable with the measuring window of
// one contended iteration, a Go duration; the default is DefaultWindow.
const WindowEnv = "DSYNC_BENCH_WINDOW"

// DefaultWindow is the measuring window of one contended iteration.
const DefaultWindow = 2 * time.Second

// EnvDial returns a Dial for the cluster named by ClusterEnv (a
// *redis.ClusterClient) or else the server named by AddrEnv, or false when
// neither variable is set.
func EnvDial() (Dial, bool) {
	if addrs := os.Getenv(ClusterEnv); addrs != "" {
		return func(tb testing.TB) redis.UniversalClient {
			rdb := redis.NewClusterClient(&redis.ClusterOptions{
				Addrs:                      strings.Split(addrs, ","),
				ClusterStateReloadInterval: clusterReload,
			})
			tb.Cleanup(func() { _ = rdb.Close() })
			return rdb
		}, true
	}
	addr := os.Getenv(AddrEnv)
	if addr == "" {
		return nil, false
	}
	return func(tb testing.TB) redis.UniversalClient {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		tb.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}, true
}

// Dsync is dsync's Mutex, one dsync.Client per go-redis client.
func Dsync(opts ...dsync.Option) Lib {
	return Lib{Name: "dsync", Open: func(rdb redis.UniversalClient) (func(string) Locker, func()) {
		c := dsync.New(rdb, opts...)
		return func(name string) Locker { return c.Mutex(name) }, func() { c.Close() }
	}}
}

// DsyncRWMutex is the write lock of dsync's RWMutex (Lock and Unlock), one
// dsync.Client per go-redis client.
func DsyncRWMutex(opts ...dsync.Option) Lib {
	return Lib{Name: "dsync-rwmutex", Open: func(rdb redis.UniversalClient) (func(string) Locker, func()) {
		c := dsync.New(rdb, opts...)
		return func(name string) Locker { return c.RWMutex(name) }, func() { c.Close() }
	}}
}

// DsyncSemaphore is dsync's Semaphore of size 1 used as a lock: Lock is
// Acquire(1) and Unlock is Release(1). One dsync.Client per go-redis client.
func DsyncSemaphore(opts ...dsync.Option) Lib {
	return Lib{Name: "dsync-semaphore", Open: func(rdb redis.UniversalClient) (func(string) Locker, func()) {
		c := dsync.New(rdb, opts...)
		return func(name string) Locker { return semLock{c.Semaphore(name, 1)} }, func() { c.Close() }
	}}
}

// semLock is a Semaphore of size 1 as a Locker.
type semLock struct{ s *dsync.Semaphore }

func (l semLock) Lock(ctx context.Context) error   { return l.s.Acquire(ctx, 1) }
func (l semLock) Unlock(ctx context.Context) error { return l.s.Release(ctx, 1) }

// Raw is the floor for a correct lock: SET NX PX with a random token and a
// compare-and-delete script, two round trips a pair. It does not wait: Lock
// fails when the name is taken, so it is measured uncontended only.
func Raw() Lib {
	return Lib{Name: "raw", Open: func(rdb redis.UniversalClient) (func(string) Locker, func()) {
		return func(name string) Locker { return &rawLock{rdb: rdb, key: name} }, func() {}
	}}
}

var rawDel = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

type rawLock struct {
	rdb redis.UniversalClient
	key string
	tok string
}

func (l *rawLock) Lock(ctx context.Context) error {
	tok := randToken()
	ok, err := l.rdb.SetNX(ctx, l.key, tok, 30*time.Second).Result()
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("raw: %s is taken", l.key)
	}
	l.tok = tok
	return nil
}

func (l *rawLock) Unlock(ctx context.Context) error {
	n, err := rawDel.Run(ctx, l.rdb, []string{l.key}, l.tok).Int()
	if err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("raw: %s was not held", l.key)
	}
	return nil
}

var tokSeq atomic.Uint64

// randToken is unique per call in this process, like the peers' tokens
// (which are random; uniqueness is what the floor needs).
func randToken() string {
	return fmt.Sprintf("%x-%x", os.Getpid(), tokSeq.Add(1))
}

// open dials a client with a round-trip counter (per node on a cluster,
// see redistest.Count) and opens lib on it.
func open(b *testing.B, lib Lib, dial Dial) (func(string) Locker, *redistest.Counter) {
	rdb := dial(b)
	counter := redistest.Count(rdb)
	handle, closeLib := lib.Open(rdb)
	b.Cleanup(closeLib)
	return handle, counter
}

// Uncontended runs b.N Lock+Unlock pairs on one name from one goroutine and
// reports pairs/s, round trips and allocations per pair.
func Uncontended(b *testing.B, lib Lib, dial Dial, name string) {
	handle, counter := open(b, lib, dial)
	l := handle(name)
	ctx := context.Background()
	pair := func() {
		if err := l.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
	pair() // warm up: connection, script cache
	counter.Reset()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		pair()
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
	b.ReportMetric(float64(counter.RoundTrips())/float64(b.N), "roundtrips/op")
}

// Distinct runs b.N Lock+Unlock pairs over names distinct names from
// goroutines goroutines on one client; goroutine g uses the names
// g, g+goroutines, ..., so no two goroutines ever want the same name.
func Distinct(b *testing.B, lib Lib, dial Dial, prefix string, names, goroutines int) {
	handle, counter := open(b, lib, dial)
	ctx := context.Background()
	own := make([][]Locker, goroutines)
	for i := range names {
		g := i % goroutines
		own[g] = append(own[g], handle(fmt.Sprintf("%s:%d", prefix, i)))
	}
	for _, ls := range own { // warm up: connections, script cache
		if err := ls[0].Lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := ls[0].Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
	counter.Reset()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for _, ls := range own {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; next.Add(1) <= int64(b.N); i++ {
				l := ls[i%len(ls)]
				if err := l.Lock(ctx); err != nil {
					b.Error(err)
					return
				}
				if err := l.Unlock(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
	b.ReportMetric(float64(counter.RoundTrips())/float64(b.N), "roundtrips/op")
}

// Window returns the measuring window of one contended iteration.
func Window(tb testing.TB) time.Duration {
	s := os.Getenv(WindowEnv)
	if s == "" {
		return DefaultWindow
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		tb.Fatalf("lockbench: bad %s=%q", WindowEnv, s)
	}
	return d
}

// maxDrain bounds how long a contended iteration waits, after its window,
// for the goroutines still waiting to get the lock once and leave.
const maxDrain = 60 * time.Second

// Contended runs goroutines goroutines, spread over clients clients (each
// its own go-redis client), that lock one name, count themselves in the
// critical section and unlock at once, for a fixed window per iteration.
// A Lock that fails (a peer's retry budget ran out) is called again; the
// wait runs from the first call. After the window nobody starts a new Lock;
// those still waiting get the lock once, so every wait is complete.
//
// It reports, over all iterations: acq/s (acquisitions inside the window),
// wait-p50-ms, wait-p99-ms, wait-max-ms (Lock call to Lock return),
// handoff-us (median time from an Unlock call to the next holder's Lock
// return), fairness (fewest/most acquisitions per goroutine), retake-%
// (acquisitions by the goroutine that held the lock just before),
// violations (two holders at once; must be 0), lock-errors (failed Lock
// calls that were retried), allocs/acq and roundtrips/acq.
func Contended(b *testing.B, lib Lib, dial Dial, name string, clients, goroutines int) {
	window := Window(b)
	handles := make([]func(string) Locker, clients)
	counters := make([]*redistest.Counter, clients)
	for i := range clients {
		handles[i], counters[i] = open(b, lib, dial)
	}
	lockers := make([]Locker, goroutines)
	for g := range goroutines {
		lockers[g] = handles[g%clients](name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(b.N)*(window+maxDrain))
	defer cancel()
	for _, l := range lockers[:clients] { // warm up: connections, script cache
		if err := l.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range counters {
		c.Reset()
	}

	var (
		waits     []time.Duration
		handoffs  []time.Duration
		perG      = make([]int64, goroutines)
		inWindow  int64
		total     int64
		retakes   int64
		lockErrs  atomic.Int64
		violation atomic.Int64
		measured  time.Duration
	)
	var ms0, ms1 runtime.MemStats
	b.ResetTimer()
	runtime.ReadMemStats(&ms0)
	for range b.N {
		r := runWindow(ctx, b, lockers, window, &lockErrs, &violation)
		waits = append(waits, r.waits...)
		handoffs = append(handoffs, r.handoffs...)
		for g, n := range r.perG {
			perG[g] += n
		}
		inWindow += r.inWindow
		total += r.total
		retakes += r.retakes
		measured += window
	}
	runtime.ReadMemStats(&ms1)
	b.StopTimer()
	if b.Failed() {
		return
	}

	var trips int64
	for _, c := range counters {
		trips += c.RoundTrips()
	}
	slices.Sort(waits)
	slices.Sort(handoffs)
	lo, hi := slices.Min(perG), slices.Max(perG)
	fair := 0.0
	if hi > 0 {
		fair = float64(lo) / float64(hi)
	}
	b.ReportMetric(float64(inWindow)/measured.Seconds(), "acq/s")
	b.ReportMetric(ms(Quantile(waits, 0.50)), "wait-p50-ms")
	b.ReportMetric(ms(Quantile(waits, 0.99)), "wait-p99-ms")
	b.ReportMetric(ms(Quantile(waits, 1)), "wait-max-ms")
	b.ReportMetric(float64(Quantile(handoffs, 0.5))/float64(time.Microsecond), "handoff-us")
	b.ReportMetric(fair, "fairness")
	b.ReportMetric(100*float64(retakes)/math.Max(1, float64(total)), "retake-%")
	b.ReportMetric(float64(violation.Load()), "violations")
	b.ReportMetric(float64(lockErrs.Load()), "lock-errors")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/math.Max(1, float64(total)), "allocs/acq")
	b.ReportMetric(float64(trips)/math.Max(1, float64(total)), "roundtrips/acq")
	if v := violation.Load(); v != 0 {
		b.Errorf("%s: %d times two holders at once", lib.Name, v)
	}
}

type windowResult struct {
	waits, handoffs []time.Duration
	perG            []int64 // acquisitions inside the window per goroutine
	inWindow, total int64
	retakes         int64
}

// runWindow runs one contended iteration.
func runWindow(ctx context.Context, b *testing.B, lockers []Locker, window time.Duration, lockErrs, violation *atomic.Int64) windowResult {
	var (
		inCS       atomic.Int64
		lastUnlock atomic.Int64 // ns since t0 of the last Unlock call, or -1
		lastHolder atomic.Int64 // goroutine that held last, or -1
		wg         sync.WaitGroup
		mu         sync.Mutex
		res        = windowResult{perG: make([]int64, len(lockers))}
	)
	lastUnlock.Store(-1)
	lastHolder.Store(-1)
	t0 := time.Now()
	end := t0.Add(window)
	for g, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var waits, handoffs []time.Duration
			var n, total, retakes int64
			defer func() {
				mu.Lock()
				res.waits = append(res.waits, waits...)
				res.handoffs = append(res.handoffs, handoffs...)
				res.perG[g] = n
				res.inWindow += n
				res.total += total
				res.retakes += retakes
				mu.Unlock()
			}()
			for time.Now().Before(end) {
				called := time.Now()
				for {
					err := l.Lock(ctx)
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						b.Errorf("goroutine %d: lock: %v", g, err)
						return
					}
					lockErrs.Add(1)
				}
				got := time.Now()
				if inCS.Add(1) != 1 {
					violation.Add(1)
				}
				waits = append(waits, got.Sub(called))
				if u := lastUnlock.Load(); u >= 0 {
					handoffs = append(handoffs, got.Sub(t0)-time.Duration(u))
				}
				if lastHolder.Swap(int64(g)) == int64(g) {
					retakes++
				}
				total++
				if got.Before(end) {
					n++
				}
				inCS.Add(-1)
				lastUnlock.Store(int64(time.Since(t0)))
				if err := l.Unlock(ctx); err != nil {
					b.Errorf("goroutine %d: unlock: %v", g, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return res
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Quantile returns the q-quantile of sorted ds (nearest rank), 0 if empty.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[max(0, min(i, len(ds)-1))]
}
