package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/keys"
)

const (
	defaultReplicas = 5
	defaultFor      = 3 * time.Second
	maxReplicas     = 100
	winnersDrawn    = 10
	ticketCount     = 10_000
	demoKeyLife     = time.Hour // the demo's own keys expire after this
	demoSlack       = 30 * time.Second
)

const demoHead = `Usage: dsync demo [flags]

Shows dsync at work, on an embedded Redis unless -redis or $REDIS_URL names
one (the demo's keys are fresh names that expire within an hour).

1. The noon lottery: -replicas goroutines, each with its own Redis
   connection and dsync.Client as if it were a separate process, call
   DoValue on the Once "lottery:<run>" at the same moment. One of them runs
   the draw of 10 winning tickets, with a random source seeded differently
   in each replica; the others wait and receive the stored winners. All
   print the same winners, which shows that exactly one replica drew.

2. Contention: the same clients lock and unlock the Mutex "contention:<run>"
   as fast as they can for -for, with a live line on stderr (acquisitions
   per second, goroutines waiting, waiters queued in Redis), then a summary:
   acquisitions, fewest and most per client, the longest wait, and the
   number of times two holders were inside the critical section at once
   (counted there; it must be 0), and whether fencing tokens always rose.
`

const demoTail = `Exit status: 0, or 1 when a check failed (replicas saw different winners,
two holders at once, a fencing token that did not rise) or on an error;
2 on bad usage.
`

func cmdDemo(args []string, stdout, stderr io.Writer) int {
	var c conn
	fs := newFlagSet("demo", demoHead, demoTail, stdout)
	c.register(fs, "an embedded Redis (miniredis)")
	replicas := fs.Int("replicas", defaultReplicas, "number of replicas (clients), 2 to 100")
	dur := fs.Duration("for", defaultFor, "how long the contention run lasts (0 skips it)")
	workers := fs.Int("workers", 2, "goroutines per client in the contention run")
	seed := fs.Uint64("seed", 0, "seed of the draw (0: from the clock)")
	if code, done := parse(fs, args, stderr); done {
		return code
	}
	switch {
	case fs.NArg() > 0:
		return usageErr(stderr, "demo", "unexpected argument %q", fs.Arg(0))
	case *replicas < 2 || *replicas > maxReplicas:
		return usageErr(stderr, "demo", "-replicas %d, want 2 to %d", *replicas, maxReplicas)
	case *workers < 1 || *workers > maxReplicas:
		return usageErr(stderr, "demo", "-workers %d, want 1 to %d", *workers, maxReplicas)
	case *dur < 0:
		return usageErr(stderr, "demo", "-for %v, want ≥ 0", *dur)
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}

	ctx := context.Background()
	url := c.resolved("")
	where := ""
	if url == "" {
		mr := miniredis.NewMiniRedis()
		// TTLs run down with the clock, as on a real server.
		mr.ClockTTL(true)
		if err := mr.Start(); err != nil {
			return fail(stderr, "demo", exitError, fmt.Errorf("embedded Redis: %w", err))
		}
		defer mr.Close()
		url, c.cluster = "redis://"+mr.Addr(), false
		where = "embedded Redis (miniredis) at " + mr.Addr()
	}
	d := &demo{stdout: stdout, stderr: stderr, prefix: c.prefix, run: uuid.NewString()[:8]}
	defer d.close()
	for range *replicas {
		rdb, addr, err := c.dial(ctx, url)
		if err != nil {
			return fail(stderr, "demo", exitError, err)
		}
		if where == "" {
			where = "Redis at " + addr
		}
		d.rdbs = append(d.rdbs, rdb)
		d.clients = append(d.clients, dsync.New(rdb, dsync.Prefix(c.prefix)))
	}
	fmt.Fprintf(stdout, "dsync demo on %s\n\n", where)
	if err := d.lottery(ctx, *seed); err != nil {
		return fail(stderr, "demo", exitError, err)
	}
	if *dur == 0 {
		return exitOK
	}
	fmt.Fprintln(stdout)
	if err := d.contention(ctx, *dur, *workers); err != nil {
		return fail(stderr, "demo", exitError, err)
	}
	return exitOK
}

type demo struct {
	stdout, stderr io.Writer
	prefix, run    string
	rdbs           []redis.UniversalClient
	clients        []*dsync.Client
}

func (d *demo) close() {
	for _, c := range d.clients {
		_ = c.Close()
	}
	for _, r := range d.rdbs {
		_ = r.Close()
	}
}

// draw returns n distinct tickets in drawing order.
func draw(r *rand.Rand, n int) []int {
	seen := map[int]bool{}
	var out []int
	for len(out) < n {
		t := 1 + r.IntN(ticketCount)
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}

func formatTickets(ts []int) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = fmt.Sprintf("#%04d", t)
	}
	return strings.Join(parts, " ")
}

func parseTickets(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Fields(s) {
		n, err := strconv.Atoi(strings.TrimPrefix(f, "#"))
		if err != nil {
			return nil, fmt.Errorf("stored winners %q: %w", s, err)
		}
		out = append(out, n)
	}
	return out, nil
}

type ticketResult struct {
	winners []int
	drew    bool
	waited  time.Duration
	err     error
}

// lottery races the replicas for the draw.
func (d *demo) lottery(ctx context.Context, seed uint64) error {
	name := "lottery:" + d.run
	fmt.Fprintf(d.stdout, "The noon lottery: %d replicas call Once(%q).DoValue; one draws %d winners, all get them.\n",
		len(d.clients), name, winnersDrawn)

	ctx, cancel := context.WithTimeout(ctx, demoSlack)
	defer cancel()
	res := make([]ticketResult, len(d.clients))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range d.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res[i] = d.replica(ctx, i, name, seed)
		}()
	}
	close(start)
	wg.Wait()

	drew := 0
	for i, r := range res {
		if r.err != nil {
			return fmt.Errorf("replica %d: %w", i+1, r.err)
		}
		how := "got "
		if r.drew {
			how = "DREW"
			drew++
		}
		fmt.Fprintf(d.stdout, "  replica %d  after %-6v  %s winners: %s\n",
			i+1, r.waited.Round(time.Millisecond), how, formatTickets(r.winners))
	}
	for _, r := range res[1:] {
		if !slices.Equal(r.winners, res[0].winners) {
			return errors.New("replicas saw different winners")
		}
	}
	if drew != 1 {
		return fmt.Errorf("%d replicas drew, want exactly 1", drew)
	}
	fmt.Fprintf(d.stdout, "Exactly one replica drew (seed %d); all %d print the same winners.\n", seed, len(d.clients))
	return nil
}

// replica is one replica's part of the lottery. Each replica would seed its
// source differently, so a second draw would show as different winners.
func (d *demo) replica(ctx context.Context, i int, name string, seed uint64) ticketResult {
	// The done mark (with the winners) expires: the demo leaves nothing
	// behind for good.
	once := d.clients[i].Once(name, dsync.Period(demoKeyLife))
	t0 := time.Now()
	var r ticketResult
	v, err := once.DoValue(ctx, func(ctx context.Context) ([]byte, error) {
		r.drew = true
		return []byte(formatTickets(draw(rand.New(rand.NewPCG(seed, uint64(i))), winnersDrawn))), nil
	})
	r.waited = time.Since(t0)
	if err != nil {
		r.err = err
		return r
	}
	r.winners, r.err = parseTickets(string(v))
	return r
}

// contention hammers one Mutex from every client for dur.
func (d *demo) contention(ctx context.Context, dur time.Duration, workers int) error {
	name := "contention:" + d.run
	fmt.Fprintf(d.stdout, "Contention: %d clients × %d goroutines lock and unlock the Mutex %q for %v.\n",
		len(d.clients), workers, name, dur)

	var (
		total, waiting, inside, violations, backwards atomic.Int64
		lastFence                                     atomic.Uint64
		maxWait                                       atomic.Int64
		perClient                                     = make([]atomic.Int64, len(d.clients))
		errOnce                                       sync.Once
		firstErr                                      error
	)
	runCtx, stop := context.WithTimeout(ctx, dur)
	defer stop()
	var wg sync.WaitGroup
	for i, c := range d.clients {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m := c.Mutex(name)
				for runCtx.Err() == nil {
					t0 := time.Now()
					waiting.Add(1)
					err := m.Lock(runCtx)
					waiting.Add(-1)
					if err != nil {
						if runCtx.Err() == nil {
							errOnce.Do(func() { firstErr = err; stop() })
						}
						return
					}
					w := time.Since(t0).Nanoseconds()
					for cur := maxWait.Load(); w > cur && !maxWait.CompareAndSwap(cur, w); cur = maxWait.Load() {
					}
					// The critical section: count who is inside, and
					// check that fencing tokens only rise.
					if inside.Add(1) != 1 {
						violations.Add(1)
					}
					if l, err := m.Lease(runCtx); err == nil {
						if l.Token() <= lastFence.Load() {
							backwards.Add(1)
						}
						lastFence.Store(l.Token())
					}
					total.Add(1)
					perClient[i].Add(1)
					inside.Add(-1)
					uctx, cancel := context.WithTimeout(ctx, unlockWait)
					err = m.Unlock(uctx)
					cancel()
					if err != nil {
						errOnce.Do(func() { firstErr = err; stop() })
						return
					}
				}
			}()
		}
	}

	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		d.progress(runCtx, name, &total, &waiting)
	}()
	wg.Wait()
	stop()
	<-progressDone
	// The name is this run's own: its fencing counter, which dsync keeps
	// for a day after the last hold, is of no use to anyone now.
	dctx, cancel := context.WithTimeout(ctx, unlockWait)
	_ = d.rdbs[0].Del(dctx, keys.ForMutex(d.prefix, name).Fence).Err()
	cancel()
	if firstErr != nil {
		return firstErr
	}

	n := total.Load()
	fewest, most := int64(-1), int64(0)
	for i := range perClient {
		v := perClient[i].Load()
		if fewest < 0 || v < fewest {
			fewest = v
		}
		most = max(most, v)
	}
	secs := dur.Seconds()
	fmt.Fprintf(d.stdout, "  acquisitions  %d (%.0f/s)\n", n, float64(n)/secs)
	fmt.Fprintf(d.stdout, "  per client    fewest %d, most %d\n", fewest, most)
	fmt.Fprintf(d.stdout, "  max wait      %v\n", time.Duration(maxWait.Load()).Round(time.Millisecond))
	fmt.Fprintf(d.stdout, "  violations    %d (two holders inside the critical section at once)\n", violations.Load())
	fmt.Fprintf(d.stdout, "  fencing       %d tokens did not rise\n", backwards.Load())
	switch {
	case violations.Load() > 0:
		return fmt.Errorf("%d violations of mutual exclusion", violations.Load())
	case backwards.Load() > 0:
		return fmt.Errorf("%d fencing tokens did not rise", backwards.Load())
	}
	return nil
}

// progress writes a live line on stderr until ctx ends: rewritten in place
// on a terminal, one line a second otherwise.
func (d *demo) progress(ctx context.Context, name string, total, waiting *atomic.Int64) {
	tty := isTerminal(d.stderr)
	every := time.Second
	if tty {
		every = 200 * time.Millisecond
	}
	queue := keys.ForMutex(d.prefix, name).Queue
	start := time.Now()
	t := time.NewTicker(every)
	defer t.Stop()
	type sample struct {
		at time.Time
		n  int64
	}
	var window []sample // the last second, for the rate
	for {
		select {
		case <-ctx.Done():
			if tty {
				fmt.Fprint(d.stderr, "\r\033[K")
			}
			return
		case now := <-t.C:
			n := total.Load()
			window = append(window, sample{now, n})
			for len(window) > 1 && now.Sub(window[0].at) > time.Second+every/2 {
				window = window[1:]
			}
			rate := 0.0
			if dt := now.Sub(window[0].at).Seconds(); dt > 0 {
				rate = float64(n-window[0].n) / dt
			} else if s := now.Sub(start).Seconds(); s > 0 {
				rate = float64(n) / s
			}
			qctx, cancel := context.WithTimeout(ctx, every)
			queued, err := d.rdbs[0].ZCard(qctx, queue).Result()
			cancel()
			q := strconv.FormatInt(queued, 10)
			if err != nil {
				q = "?"
			}
			line := fmt.Sprintf("  %5.1fs  %7d acquisitions  %6.0f/s  waiting %d  queued in Redis %s",
				now.Sub(start).Seconds(), n, rate, waiting.Load(), q)
			if tty {
				fmt.Fprint(d.stderr, "\r\033[K"+line)
			} else {
				fmt.Fprintln(d.stderr, line)
			}
		}
	}
}

// isTerminal reports whether w is a character device such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
