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

// hold takes a hold through lock, reads its fencing token through lease
// (unless lease is nil), keeps it for a random pause, gives it back through
// unlock and records the span it held: s with its times and token. A lock
// that ctx's end cuts short records nothing; a release that ctx's end cuts
// short completes in the background (see endedDuring).
func (h *history) hold(t *testing.T, ctx context.Context, r *rand.Rand, s span, lock, unlock func(context.Context) error, lease func(context.Context) (*dsync.Lease, error)) {
	if err := lock(ctx); err != nil {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("lock: %v", err)
		}
		return
	}
	s.from = time.Now()
	if lease != nil {
		if l, err := lease(ctx); err != nil {
			t.Errorf("Lease: %v", err)
		} else {
			s.token = l.Token()
		}
	}
	pause(r)
	s.to = time.Now()
	if err := unlock(ctx); err != nil && !endedDuring(ctx, err) {
		t.Errorf("unlock: %v", err)
	}
	h.add(s)
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

// runHistory runs f on the real server (or skips) for the histories: 6
// workers on 3 Clients for 2 s (see runFor).
func runHistory(t *testing.T, f func(ctx context.Context, c *dsync.Client, who int, r *rand.Rand)) {
	runFor(t, realOnly(t), 3, 6, 2*time.Second, f)
}

// endedDuring reports whether err, the error of a release made with ctx,
// is ctx's own: ctx ended while the release was under way, which then
// completes in the background (as Unlock documents).
func endedDuring(ctx context.Context, err error) bool {
	return ctx.Err() != nil && errors.Is(err, ctx.Err())
}

func pause(r *rand.Rand) { time.Sleep(time.Duration(r.IntN(1500)) * time.Microsecond) }

func TestConcurrentMutexHistory(t *testing.T) {
	name := redistest.Key(t)
	var h history
	runHistory(t, func(ctx context.Context, c *dsync.Client, who int, r *rand.Rand) {
		m := c.Mutex(name)
		lctx := ctx
		if r.IntN(2) == 0 {
			lctx = dsync.WithOwner(ctx)
		}
		h.hold(t, lctx, r, span{write: true, who: who}, m.Lock, m.Unlock, m.Lease)
	})
	checkExclusion(t, "Mutex", h.spans)
}

func TestConcurrentRWMutexHistory(t *testing.T) {
	name := redistest.Key(t)
	var h history
	runHistory(t, func(ctx context.Context, c *dsync.Client, who int, r *rand.Rand) {
		rw := c.RWMutex(name)
		if r.IntN(3) == 0 {
			h.hold(t, ctx, r, span{write: true, who: who}, rw.Lock, rw.Unlock, rw.Lease)
		} else {
			h.hold(t, ctx, r, span{who: who}, rw.RLock, rw.RUnlock, nil)
		}
	})
	checkExclusion(t, "RWMutex", h.spans)
}

func TestConcurrentSemaphoreHistory(t *testing.T) {
	name := redistest.Key(t)
	const size = 3
	var h history
	runHistory(t, func(ctx context.Context, c *dsync.Client, who int, r *rand.Rand) {
		s := c.Semaphore(name, size)
		n := int64(1 + r.IntN(2))
		h.hold(t, ctx, r, span{n: n, who: who},
			func(ctx context.Context) error { return s.Acquire(ctx, n) },
			func(ctx context.Context) error { return s.Release(ctx, n) }, nil)
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
	name := redistest.Key(t)
	var h history
	var mu sync.Mutex
	var succeeded time.Time
	runHistory(t, func(ctx context.Context, c *dsync.Client, who int, r *rand.Rand) {
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

// inParallel runs f on n goroutines at once and waits for them; an error
// f returns is reported.
func inParallel(t *testing.T, n int, f func() error) {
	steps := make([]func() error, n)
	for i := range steps {
		steps[i] = f
	}
	runSteps(t, 1, steps)
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
