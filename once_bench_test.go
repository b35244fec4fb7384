package dsync_test

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/lockbench"
	"github.com/dsync-go/dsync/internal/redistest"
)

// onceWork is what f does in BenchmarkOnceContended: it sleeps 1 ms, so that
// the other calls of a round reach Redis while f runs and have to wait for
// the end of the run, as they would behind real work. With an f that
// returns at once most calls would find the Once already done.
const onceWork = time.Millisecond

// onceRoundLimit bounds one round of BenchmarkOnceContended: every Do of
// the round gives up when it has not returned by then.
const onceRoundLimit = 30 * time.Second

// BenchmarkOnceContended is G = 8 or 32 goroutines spread over 4 Clients
// that all call Once.Do on one fresh name at the same moment, a new name
// per round; f sleeps 1 ms (onceWork). An iteration is one round (run with
// -benchtime=Nx for N rounds). It fails if f did not run exactly once in a
// round. It reports Do/s (Do calls per second of round time),
// round-p50-ms, round-p99-ms and round-max-ms (from the start of a round
// until every Do of it returned), roundtrips/Do and allocs/Do.
func BenchmarkOnceContended(b *testing.B) {
	const clients = 4
	for _, g := range []int{8, 32} {
		b.Run(fmt.Sprintf("G=%d", g), func(b *testing.B) {
			onceContended(b, clients, g)
		})
	}
}

// onceRound is one round of onceContended: the Once handles on its name,
// one per Client, and when each goroutine's Do returned.
type onceRound struct {
	ctx   context.Context
	start chan struct{} // closed when the goroutines are to call Do
	once  []*dsync.Once
	ends  []time.Time
	wg    sync.WaitGroup
}

func onceContended(b *testing.B, clients, goroutines int) {
	prefix := redistest.Key(b)
	cs := make([]*dsync.Client, clients)
	counters := make([]*redistest.Counter, clients)
	for i := range clients {
		cs[i], counters[i] = benchClient(b)
	}

	// One goroutine per caller for the whole benchmark, handed each round
	// on its own channel, so that a round starts no goroutines.
	var runs atomic.Int64 // calls of f in the current round
	f := func(context.Context) error {
		runs.Add(1)
		time.Sleep(onceWork)
		return nil
	}
	work := make([]chan *onceRound, goroutines)
	var workers sync.WaitGroup
	for g := range goroutines {
		work[g] = make(chan *onceRound, 1)
		workers.Add(1)
		go func() {
			defer workers.Done()
			for r := range work[g] {
				<-r.start
				err := r.once[g%clients].Do(r.ctx, f)
				r.ends[g] = time.Now()
				if err != nil {
					b.Errorf("goroutine %d: Do: %v", g, err)
				}
				r.wg.Done()
			}
		}()
	}
	defer func() {
		for _, w := range work {
			close(w)
		}
		workers.Wait()
	}()

	// round runs round i and returns how long it took; f must have run
	// exactly once.
	var ms0, ms1 runtime.MemStats
	var mallocs uint64
	round := func(i int) time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), onceRoundLimit)
		defer cancel()
		name := fmt.Sprintf("%s:%d", prefix, i)
		r := &onceRound{ctx: ctx, start: make(chan struct{}), ends: make([]time.Time, goroutines)}
		for _, c := range cs {
			r.once = append(r.once, c.Once(name))
		}
		r.wg.Add(goroutines)
		runs.Store(0)
		for _, w := range work {
			w <- r
		}
		runtime.ReadMemStats(&ms0)
		b.StartTimer()
		t0 := time.Now()
		close(r.start)
		r.wg.Wait()
		b.StopTimer()
		runtime.ReadMemStats(&ms1)
		mallocs += ms1.Mallocs - ms0.Mallocs
		if b.Failed() {
			b.FailNow()
		}
		if n := runs.Load(); n != 1 {
			b.Fatalf("round %d: f ran %d times, want 1", i, n)
		}
		last := t0
		for _, t := range r.ends {
			if t.After(last) {
				last = t
			}
		}
		return last.Sub(t0)
	}

	b.StopTimer()
	round(-1) // warm up: connections, script cache, subscriptions
	mallocs = 0
	for _, c := range counters {
		c.Reset()
	}
	b.ResetTimer()
	rounds := make([]time.Duration, 0, b.N)
	var total time.Duration
	for i := range b.N {
		d := round(i)
		rounds = append(rounds, d)
		total += d
	}
	var trips int64
	for _, c := range counters {
		trips += c.RoundTrips()
	}
	calls := float64(b.N * goroutines)
	slices.Sort(rounds)
	b.ReportMetric(calls/total.Seconds(), "Do/s")
	b.ReportMetric(msOf(lockbench.Quantile(rounds, 0.50)), "round-p50-ms")
	b.ReportMetric(msOf(lockbench.Quantile(rounds, 0.99)), "round-p99-ms")
	b.ReportMetric(msOf(lockbench.Quantile(rounds, 1)), "round-max-ms")
	b.ReportMetric(float64(trips)/calls, "roundtrips/Do")
	b.ReportMetric(float64(mallocs)/math.Max(1, calls), "allocs/Do")
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
