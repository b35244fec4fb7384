package dsync_test

// A concurrent checker on the real server: goroutines on several Clients
// run random blocking operations for about two seconds; the history (call
// and return times, fencing tokens, permits) is recorded and checked.
//
// The check is an interval-overlap check rather than a general
// linearizability checker (such as porcupine): for a lock, the true hold of
// a successful acquisition contains the interval from the acquire call's
// return to the release call's start, whatever the network did. So if two
// such intervals of writers (or of a writer and a reader) overlap, two holds
// overlapped: a violation, with no false alarm. If they do not overlap, the
// order of the acquire returns is the order of the acquisitions, so fencing
// tokens must rise in that order. For a semaphore, the permits of the
// intervals alive at any instant must not exceed the size. For a Once, runs
// of f must not overlap and none may start after one succeeded. These
// checks are sound and cost a sort; they miss only overlaps hidden inside
// the call/return uncertainty, which a linearizability checker would not
// find either.

import (
	"context"
	"errors"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// span is one successful hold: from the acquire's return to the release's
// call.
type span struct {
	from, to time.Time
	token    uint64
	write    bool
	n        int64
	who      int
}

type history struct {
	mu    sync.Mutex
	spans []span
}

func (h *history) add(s span) {
	h.mu.Lock()
	h.spans = append(h.spans, s)
	h.mu.Unlock()
}

// checkExclusion fails if a write span overlaps any other span, or if write
// tokens do not rise with the order of acquisition.
func checkExclusion(t *testing.T, what string, spans []span) {
	t.Helper()
	sort.Slice(spans, func(i, j int) bool { return spans[i].from.Before(spans[j].from) })
	var lastW *span
	var lastEnd time.Time // latest end of any span so far
	var lastEndW time.Time
	writes := 0
	for i := range spans {
		s := &spans[i]
		if s.write && s.from.Before(lastEnd) {
			t.Errorf("%s: write hold of %d from %v overlaps an earlier hold ending %v", what, s.who, s.from, lastEnd)
		}
		if !s.write && s.from.Before(lastEndW) {
			t.Errorf("%s: read hold of %d from %v overlaps a write hold ending %v", what, s.who, s.from, lastEndW)
		}
		if s.write {
			writes++
			if lastW != nil && s.token <= lastW.token {
				t.Errorf("%s: fencing token %d acquired after %d", what, s.token, lastW.token)
			}
			lastW = s
			if s.to.After(lastEndW) {
				lastEndW = s.to
			}
		}
		if s.to.After(lastEnd) {
			lastEnd = s.to
		}
	}
	t.Logf("%s: %d holds (%d writes) checked", what, len(spans), writes)
}

// runFor runs f on workers goroutines spread over clients Clients until d
// has passed.
func runFor(t *testing.T, b redistest.Backend, clients, workers int, d time.Duration, f func(ctx context.Context, c *dsync.Client, who int, r *rand.Rand)) {
	t.Helper()
	cs := make([]*dsync.Client, clients)
	for i := range cs {
		cs[i] = newClient(t, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := 0; i < 100000 && ctx.Err() == nil; i++ {
				f(ctx, cs[w%clients], w, r)
			}
		}()
	}
	wg.Wait()
}

// endedDuring reports whether err, the error of a release made with ctx,
// is ctx's own: ctx ended while the release was under way, which then
// completes in the background (as Unlock documents).
func endedDuring(ctx context.Context, err error) bool {
	return ctx.Err() != nil && errors.Is(err, ctx.Err())
}

func pause(r *rand.Rand) { time.Sleep(time.Duration(r.IntN(1500)) * time.Microsecond) }

func TestConcurrentMutexHistory(t *testing.T) {
	b := realOnly(t)
	name := redistest.Key(t)
	var h history
	runFor(t, b, 3, 6, 2*time.Second, func(ctx context.Context, c *dsync.Client, who int, r *rand.Rand) {
		m := c.Mutex(name)
		lctx := ctx
		if r.IntN(2) == 0 {
			lctx = dsync.WithOwner(ctx)
		}
		if err := m.Lock(lctx); err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Lock: %v", err)
			}
			return
		}
		from := time.Now()
		l, err := m.Lease(lctx)
		if err != nil {
			t.Errorf("Lease: %v", err)
		}
		pause(r)
		to := time.Now()
		if err := m.Unlock(lctx); err != nil && !endedDuring(lctx, err) {
			t.Errorf("Unlock: %v", err)
		}
		h.add(span{from: from, to: to, token: l.Token(), write: true, who: who})
	})
	checkExclusion(t, "Mutex", h.spans)
}

func TestConcurrentRWMutexHistory(t *testing.T) {
	b := realOnly(t)
	name := redistest.Key(t)
	var h history
	runFor(t, b, 3, 6, 2*time.Second, func(ctx context.Context, c *dsync.Client, who int, r *rand.Rand) {
		rw := c.RWMutex(name)
		write := r.IntN(3) == 0
		lock, unlock := rw.RLock, rw.RUnlock
		if write {
			lock, unlock = rw.Lock, rw.Unlock
		}
		if err := lock(ctx); err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("lock: %v", err)
			}
			return
		}
		from := time.Now()
		var tok uint64
		if write {
			l, err := rw.Lease(ctx)
			if err != nil {
				t.Errorf("Lease: %v", err)
			} else {
				tok = l.Token()
			}
		}
		pause(r)
		to := time.Now()
		if err := unlock(ctx); err != nil && !endedDuring(ctx, err) {
			t.Errorf("unlock: %v", err)
		}
		h.add(span{from: from, to: to, token: tok, write: write, who: who})
	})
	checkExclusion(t, "RWMutex", h.spans)
}

func TestConcurrentSemaphoreHistory(t *testing.T) {
	b := realOnly(t)
	name := redistest.Key(t)
	const size = 3
	var h history
	runFor(t, b, 3, 6, 2*time.Second, func(ctx context.Context, c *dsync.Client, who int, r *rand.Rand) {
		s := c.Semaphore(name, size)
		n := int64(1 + r.IntN(2))
		if err := s.Acquire(ctx, n); err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Acquire: %v", err)
			}
			return
		}
		from := time.Now()
		pause(r)
		to := time.Now()
		if err := s.Release(ctx, n); err != nil && !endedDuring(ctx, err) {
			t.Errorf("Release: %v", err)
		}
		h.add(span{from: from, to: to, n: n, who: who})
	})
	// Sweep: at equal instants, releases first.
	type ev struct {
		at time.Time
		d  int64
	}
	var evs []ev
	for _, s := range h.spans {
		evs = append(evs, ev{s.from, s.n}, ev{s.to, -s.n})
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].at.Equal(evs[j].at) {
			return evs[i].d < evs[j].d
		}
		return evs[i].at.Before(evs[j].at)
	})
	var cur, peak int64
	for _, e := range evs {
		cur += e.d
		peak = max(peak, cur)
		if cur > size {
			t.Fatalf("Semaphore: %d permits held at %v, size %d", cur, e.at, size)
		}
	}
	t.Logf("Semaphore: %d holdings checked, peak %d of %d permits", len(h.spans), peak, size)
}

func TestConcurrentOnceHistory(t *testing.T) {
	b := realOnly(t)
	name := redistest.Key(t)
	var h history
	var mu sync.Mutex
	var succeeded time.Time
	runFor(t, b, 3, 6, 2*time.Second, func(ctx context.Context, c *dsync.Client, who int, r *rand.Rand) {
		o := c.Once(name)
		ok := r.IntN(8) == 0
		err := o.Do(ctx, func(context.Context) error {
			from := time.Now()
			mu.Lock()
			late := !succeeded.IsZero()
			mu.Unlock()
			if late {
				t.Errorf("Once: f ran after a run succeeded")
			}
			pause(r)
			to := time.Now()
			h.add(span{from: from, to: to, write: true, who: who})
			if ok {
				mu.Lock()
				succeeded = to
				mu.Unlock()
				return nil
			}
			return errF
		})
		if err != nil && !errors.Is(err, errF) && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Do: %v", err)
		}
	})
	// Runs of f are write holds without tokens: number them in order so
	// that only overlaps count.
	sort.Slice(h.spans, func(i, j int) bool { return h.spans[i].from.Before(h.spans[j].from) })
	for i := range h.spans {
		h.spans[i].token = uint64(i + 1)
	}
	checkExclusion(t, "Once runs", h.spans)
}

// hammerClients runs, on perClient goroutines on each of clients new
// Clients of b, the step that newStep makes for each (j is its index on its
// Client) rounds times (see runSteps).
func hammerClients(t *testing.T, b redistest.Backend, clients, perClient, rounds int, newStep func(c *dsync.Client, j int) func() error) {
	t.Helper()
	var steps []func() error
	for i := 0; i < clients; i++ {
		c := newClient(t, b)
		for j := 0; j < perClient; j++ {
			steps = append(steps, newStep(c, j))
		}
	}
	runSteps(t, rounds, steps)
}

// runSteps runs each of steps rounds times on a goroutine of its own and
// waits for them. A step's error is reported and ends its goroutine.
func runSteps(t *testing.T, rounds int, steps []func() error) {
	var wg sync.WaitGroup
	for _, step := range steps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < rounds; k++ {
				if err := step(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
