package renew_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/renew"
)

var errTestLost = errors.New("test: lease lost")

var (
	script      = redis.NewScript(renewScript)
	batchScript = redis.NewScript(renewBatchScript)
)

var keySeq atomic.Int64

// acquire sets a fresh key owned by a fresh owner for ttl and returns the
// Spec that renews it.
func acquire(t *testing.T, b *backend, ttl time.Duration) renew.Spec {
	t.Helper()
	n := keySeq.Add(1)
	key := fmt.Sprintf("renew-test:{%s-%d}", t.Name(), n)
	owner := fmt.Sprintf("owner-%d", n)
	start := time.Now()
	if err := b.probe.Set(context.Background(), key, owner, ttl).Err(); err != nil {
		t.Fatalf("SET %s: %v", key, err)
	}
	return renew.Spec{
		Script: script,
		Keys:   []string{key},
		Args:   []any{owner, ttl.Milliseconds()},
		TTL:    ttl,
		Start:  start,
	}
}

func newRenewer(t *testing.T, b *backend, opts ...renew.Option) *renew.Renewer {
	r := renew.New(b.rdb, append([]renew.Option{renew.LostError(errTestLost)}, opts...)...)
	t.Cleanup(r.Close)
	return r
}

func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// waitDone waits up to limit for h to end and returns when it did.
func waitDone(t *testing.T, h *renew.Hold, limit time.Duration) time.Time {
	t.Helper()
	select {
	case <-h.Done():
		return time.Now()
	case <-time.After(limit):
		t.Fatalf("hold did not end within %v", limit)
		return time.Time{}
	}
}

func exists(t *testing.T, b *backend, key string) bool {
	t.Helper()
	n, err := b.probe.Exists(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("EXISTS %s: %v", key, err)
	}
	return n == 1
}

// held starts r renewing a fresh hold of ttl on b, the opening most tests
// share.
func held(t *testing.T, b *backend, ttl time.Duration) (*renew.Renewer, renew.Spec, *renew.Hold) {
	t.Helper()
	r := newRenewer(t, b)
	s := acquire(t, b, ttl)
	return r, s, r.Add(s)
}

// eachHeld marks t parallel and runs f on each backend, in parallel, with
// a Renewer that renews a fresh hold with ttl (see held).
func eachHeld(t *testing.T, ttl time.Duration, f func(t *testing.T, b *backend, r *renew.Renewer, s renew.Spec, h *renew.Hold)) {
	t.Parallel()
	eachBackend(t, true, func(t *testing.T, b *backend) {
		r, s, h := held(t, b, ttl)
		f(t, b, r, s, h)
	})
}

// assertLost fails unless h ended with errTestLost.
func assertLost(t *testing.T, h *renew.Hold, what string) {
	t.Helper()
	if err := h.Err(); !errors.Is(err, errTestLost) {
		t.Fatalf("%sErr() = %v, want %v", what, err, errTestLost)
	}
}

// keepsAlive checks every 100 ms until end (at most 100 times) that s's key
// exists and h is live.
func keepsAlive(t *testing.T, b *backend, s renew.Spec, h *renew.Hold, end time.Time, what string) {
	t.Helper()
	for i := 0; i < 100 && time.Now().Before(end); i++ {
		time.Sleep(100 * time.Millisecond)
		if !exists(t, b, s.Keys[0]) {
			t.Fatalf("key expired %s (%v after Start)", what, time.Since(s.Start))
		}
		assertLive(t, h)
	}
}

// waitGone waits up to limit for key to expire on the server.
func waitGone(t *testing.T, b *backend, key string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for exists(t, b, key) {
		if time.Now().After(deadline) {
			t.Fatalf("key still exists after %v", limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// liveAfter sleeps for d and checks that h is still live.
func liveAfter(t *testing.T, h *renew.Hold, d time.Duration) {
	t.Helper()
	time.Sleep(d)
	assertLive(t, h)
}

func assertLive(t *testing.T, h *renew.Hold) {
	t.Helper()
	select {
	case <-h.Done():
		t.Fatalf("hold ended early: Err() = %v", h.Err())
	default:
	}
	if err := h.Err(); err != nil {
		t.Fatalf("live hold: Err() = %v, want nil", err)
	}
}

func TestRenewalKeepsKeyAlivePastTTL(t *testing.T) {
	const ttl = time.Second
	eachHeld(t, ttl, func(t *testing.T, b *backend, r *renew.Renewer, s renew.Spec, h *renew.Hold) {
		if got, want := h.Deadline(), s.Start.Add(ttl-drift(ttl)); !got.Equal(want) {
			t.Errorf("initial Deadline() = %v, want Start+TTL-drift = %v", got, want)
		}
		keepsAlive(t, b, s, h, s.Start.Add(3*ttl+300*time.Millisecond), "despite renewal")
		pttl, err := b.probe.PTTL(context.Background(), s.Keys[0]).Result()
		if err != nil || pttl <= 0 || pttl > ttl {
			t.Fatalf("PTTL = %v, %v; want in (0, %v]", pttl, err, ttl)
		}
		if dl := h.Deadline(); !dl.After(s.Start.Add(3 * ttl)) {
			t.Errorf("Deadline() = %v after 3 TTLs, want it to have moved past Start+3TTL", dl.Sub(s.Start))
		}
		if got := b.cnt.evals.Load(); got < 6 {
			t.Errorf("renewals sent = %d, want at least 6 in 3.3 TTLs at TTL/3", got)
		}
		if got := r.Len(); got != 1 {
			t.Errorf("Len() = %d, want 1", got)
		}
	})
}

func TestReleaseStopsRenewal(t *testing.T) {
	const ttl = time.Second
	eachHeld(t, ttl, func(t *testing.T, b *backend, r *renew.Renewer, s renew.Spec, h *renew.Hold) {
		liveAfter(t, h, 1200*time.Millisecond)
		h.Release()
		waitDone(t, h, time.Second)
		if err := h.Err(); err != nil {
			t.Fatalf("Err() after Release = %v, want nil", err)
		}
		h.Release()  // idempotent
		h.MarkLost() // no effect after Release
		if err := h.Err(); err != nil {
			t.Fatalf("Err() after Release then MarkLost = %v, want nil", err)
		}
		if got := r.Len(); got != 0 {
			t.Errorf("Len() = %d after Release, want 0", got)
		}
		// A renewal already in flight may land; nothing after that.
		time.Sleep(50 * time.Millisecond)
		sent := b.cnt.evals.Load()
		waitGone(t, b, s.Keys[0], ttl+2*time.Second)
		if got := b.cnt.evals.Load(); got != sent {
			t.Errorf("renewals sent after Release = %d, want 0", got-sent)
		}
	})
}

// TestRemoteChangeIsLost: a hold whose key another client deleted or took
// over is reported lost within about one renewal interval, leaves the
// renewer, and a Release after the loss changes nothing.
func TestRemoteChangeIsLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(b *backend, key string, ttl time.Duration)
	}{
		{"KeyDeleted", func(b *backend, key string, _ time.Duration) {
			b.probe.Del(context.Background(), key)
		}},
		{"OwnerChanged", func(b *backend, key string, ttl time.Duration) {
			b.probe.Set(context.Background(), key, "someone-else", ttl)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const ttl = time.Second
			eachHeld(t, ttl, func(t *testing.T, b *backend, r *renew.Renewer, s renew.Spec, h *renew.Hold) {
				liveAfter(t, h, 400*time.Millisecond)
				tc.change(b, s.Keys[0], ttl)
				changed := time.Now()
				at := waitDone(t, h, ttl/3+time.Second)
				assertLost(t, h, "")
				if d := at.Sub(changed); d > ttl/3+500*time.Millisecond {
					t.Errorf("loss reported %v after the change, want within about one interval (%v)", d, ttl/3)
				}
				if got := r.Len(); got != 0 {
					t.Errorf("Len() = %d after loss, want 0", got)
				}
				h.Release() // safe after loss, changes nothing
				assertLost(t, h, "after Release of a lost hold: ")
			})
		})
	}
}

// lostFunc is a func as a Spec.Lost.
type lostFunc func()

func (f lostFunc) LeaseLost() { f() }

// TestLostCallback: Spec.Lost is called once for a hold that is lost
// (found gone by a renewal, or marked lost), after Done is closed, and
// never for one that is released or whose Renewer closes.
func TestLostCallback(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	eachBackend(t, true, func(t *testing.T, b *backend) {
		r := newRenewer(t, b)
		type watched struct {
			h     atomic.Pointer[renew.Hold]
			calls atomic.Int32
			early atomic.Bool // called while Done was still open
			done  chan struct{}
		}
		add := func() (*watched, renew.Spec) {
			w := &watched{done: make(chan struct{}, 4)}
			s := acquire(t, b, ttl)
			s.Lost = lostFunc(func() {
				if h := w.h.Load(); h == nil {
					w.early.Store(true)
				} else {
					select {
					case <-h.Done():
					default:
						w.early.Store(true)
					}
				}
				w.calls.Add(1)
				w.done <- struct{}{}
			})
			w.h.Store(r.Add(s))
			return w, s
		}
		gone, s := add()
		marked, _ := add()
		released, _ := add()
		closed, _ := add()

		b.probe.Del(context.Background(), s.Keys[0])
		marked.h.Load().MarkLost()
		marked.h.Load().MarkLost() // a second mark changes nothing
		released.h.Load().Release()
		for _, w := range []*watched{gone, marked} {
			select {
			case <-w.done:
			case <-time.After(ttl + 5*time.Second):
				t.Fatal("Lost was not called for a lost hold")
			}
		}
		r.Close()
		time.Sleep(100 * time.Millisecond) // room for a wrong call to show
		for what, w := range map[string]*watched{"found gone": gone, "marked lost": marked} {
			if n := w.calls.Load(); n != 1 {
				t.Errorf("hold %s: Lost called %d times, want 1", what, n)
			}
			if w.early.Load() {
				t.Errorf("hold %s: Lost called before Done was closed", what)
			}
		}
		for what, w := range map[string]*watched{"released": released, "of a closed Renewer": closed} {
			if n := w.calls.Load(); n != 0 {
				t.Errorf("hold %s: Lost called %d times, want 0", what, n)
			}
		}
	})
}

func TestMarkLostEndsHold(t *testing.T) {
	const ttl = time.Second
	eachHeld(t, ttl, func(t *testing.T, b *backend, r *renew.Renewer, _ renew.Spec, h *renew.Hold) {
		other := r.Add(acquire(t, b, ttl))
		h.MarkLost()
		waitDone(t, h, time.Second)
		assertLost(t, h, "")
		if got := r.Len(); got != 1 {
			t.Fatalf("Len() = %d, want 1", got)
		}
		time.Sleep(ttl / 2)
		assertLive(t, other) // the other hold is unaffected
		if got := b.cnt.evals.Load(); got != 1 {
			t.Errorf("renewals sent = %d, want 1 (only the other hold's)", got)
		}
	})
}

func TestUnreachableRedisIsLostBeforeServerExpiry(t *testing.T) {
	const ttl = 2 * time.Second
	eachHeld(t, ttl, func(t *testing.T, b *backend, _ *renew.Renewer, _ renew.Spec, h *renew.Hold) {
		liveAfter(t, h, 1200*time.Millisecond) // at least one renewal
		b.stop()
		stopped := time.Now()
		at := waitDone(t, h, ttl+2*time.Second)
		assertLost(t, h, "")
		lastOK := b.cnt.lastOK.Load()
		if lastOK == nil {
			t.Fatalf("no renewal succeeded before the server stopped")
		}
		// The server's expiry is at least the last successful send + TTL:
		// loss must be reported before it, never after.
		if expiry := lastOK.Add(ttl); at.After(expiry) {
			t.Errorf("loss reported %v after the earliest server expiry", at.Sub(expiry))
		}
		if dl := h.Deadline(); at.Before(dl) {
			t.Errorf("loss reported %v before the conservative deadline", dl.Sub(at))
		}
		if !at.After(stopped) {
			t.Errorf("loss reported before the server stopped")
		}
		t.Logf("lost %v after stop; deadline %v before earliest server expiry",
			at.Sub(stopped), lastOK.Add(ttl).Sub(h.Deadline()))
	})
}

func TestFixedLeaseRunsOutWithoutCommands(t *testing.T) {
	t.Parallel()
	eachBackend(t, true, func(t *testing.T, b *backend) {
		const ttl = 500 * time.Millisecond
		r := newRenewer(t, b)
		s := acquire(t, b, ttl)
		s.Interval = -1
		before := b.cnt.total()
		h := r.Add(s)
		at := waitDone(t, h, ttl+2*time.Second)
		assertLost(t, h, "")
		dl := h.Deadline()
		if want := s.Start.Add(ttl - drift(ttl)); !dl.Equal(want) {
			t.Errorf("Deadline() = %v, want Start+TTL-drift", dl.Sub(s.Start))
		}
		if at.Before(dl) {
			t.Errorf("fixed lease ended %v before its deadline", dl.Sub(at))
		}
		if late := at.Sub(s.Start.Add(ttl)); late > 200*time.Millisecond {
			t.Errorf("fixed lease ended %v after Start+TTL", late)
		}
		if got := b.cnt.total() - before; got != 0 {
			t.Errorf("commands sent for a fixed lease = %d, want 0", got)
		}
	})
}

func TestMaxHoldBoundsRenewal(t *testing.T) {
	t.Parallel()
	eachBackend(t, true, func(t *testing.T, b *backend) {
		const (
			ttl      = 600 * time.Millisecond
			interval = 200 * time.Millisecond
			maxHold  = 1100 * time.Millisecond
		)
		r := newRenewer(t, b)
		s := acquire(t, b, ttl)
		s.Interval = interval
		s.MaxHold = maxHold
		h := r.Add(s)
		at := waitDone(t, h, maxHold+2*time.Second)
		assertLost(t, h, "")
		if got := b.cnt.evals.Load(); got < 1 {
			t.Errorf("renewals sent = %d, want at least 1 before MaxHold", got)
		}
		limit := s.Start.Add(maxHold)
		if end := h.Deadline().Add(drift(ttl)); end.After(limit) {
			t.Errorf("hold extended %v past Start+MaxHold", end.Sub(limit))
		}
		if end := h.Deadline(); end.Before(s.Start.Add(ttl)) {
			t.Errorf("Deadline() = Start+%v, want renewals past Start+TTL", end.Sub(s.Start))
		}
		if at.Before(h.Deadline()) {
			t.Errorf("ended %v before its deadline", h.Deadline().Sub(at))
		}
		if late := at.Sub(limit); late > 200*time.Millisecond {
			t.Errorf("ended %v after Start+MaxHold", late)
		}
		// The server lets the key go by itself, around Start+MaxHold.
		waitGone(t, b, s.Keys[0], 2*time.Second)
		if gone := time.Since(limit); gone > 500*time.Millisecond {
			t.Errorf("key expired %v after Start+MaxHold", gone)
		}
	})
}

func TestNoScriptIsReloaded(t *testing.T) {
	const ttl = time.Second
	eachHeld(t, ttl, func(t *testing.T, b *backend, _ *renew.Renewer, s renew.Spec, h *renew.Hold) {
		liveAfter(t, h, 1200*time.Millisecond)
		if got := b.cnt.loads.Load(); got != 1 {
			t.Errorf("SCRIPT LOADs before the flush = %d, want 1", got)
		}
		if err := b.probe.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatalf("SCRIPT FLUSH: %v", err)
		}
		keepsAlive(t, b, s, h, time.Now().Add(2*ttl), "after SCRIPT FLUSH")
		if got := b.cnt.loads.Load(); got != 2 {
			t.Errorf("SCRIPT LOADs = %d, want 2 (one reload after the flush)", got)
		}
	})
}

func TestCoalescedBatches(t *testing.T) {
	t.Parallel()
	eachBackend(t, true, func(t *testing.T, b *backend) {
		const (
			ttl    = 3 * time.Second
			holds  = 250
			batch  = 100
			spread = 20 * time.Millisecond // within the coalescing window
		)
		r := newRenewer(t, b, renew.BatchSize(batch))
		specs := make([]renew.Spec, holds)
		pipe := b.probe.Pipeline()
		start := time.Now()
		for i := range specs {
			key := fmt.Sprintf("renew-test:{batch-%s-%d}", b.name, i)
			specs[i] = renew.Spec{Script: script, Keys: []string{key},
				Args: []any{"me", ttl.Milliseconds()}, TTL: ttl,
				Start: start.Add(time.Duration(i) * spread / holds)}
			pipe.Set(context.Background(), key, "me", ttl)
		}
		if _, err := pipe.Exec(context.Background()); err != nil {
			t.Fatalf("SET: %v", err)
		}
		for _, s := range specs {
			r.Add(s)
		}
		// Wait for the first tick (due at Start+TTL/3) to be done.
		deadline := time.Now().Add(ttl)
		for b.cnt.evals.Load() < holds && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		if got := b.cnt.evals.Load(); got != holds {
			t.Fatalf("renewals in the first tick = %d, want %d", got, holds)
		}
		if got, want := b.cnt.pipes.Load(), int64((holds+batch-1)/batch); got != want {
			t.Errorf("round trips for the first tick = %d, want %d", got, want)
		}
		for _, i := range []int{0, holds - 1} {
			pttl, err := b.probe.PTTL(context.Background(), specs[i].Keys[0]).Result()
			if err != nil || pttl < ttl-ttl/3 {
				t.Errorf("hold %d: PTTL after renewal = %v, %v; want about %v", i, pttl, err, ttl)
			}
		}
		if got := r.Len(); got != holds {
			t.Errorf("Len() = %d, want %d", got, holds)
		}
	})
}

// TestStalledRenewerReportsLoss stalls the renewer past the TTL and checks
// that on resuming it reports the loss instead of renewing.
func TestStalledRenewerReportsLoss(t *testing.T) {
	t.Parallel()
	eachBackend(t, true, func(t *testing.T, b *backend) {
		const (
			ttl      = 600 * time.Millisecond
			interval = 200 * time.Millisecond
		)
		var stall atomic.Bool
		entered := make(chan struct{}, 1)
		resume := make(chan struct{})
		hook := func() {
			if stall.Load() {
				select {
				case entered <- struct{}{}:
				default:
				}
				<-resume
			}
		}
		r := newRenewer(t, b)
		renew.SetStall(r, hook)
		s1, s2 := acquire(t, b, ttl), acquire(t, b, ttl)
		s1.Interval, s2.Interval = interval, interval
		h1, h2 := r.Add(s1), r.Add(s2)
		time.Sleep(interval + interval/2)
		assertLive(t, h1)
		stall.Store(true)
		select {
		case <-entered:
		case <-time.After(2 * time.Second):
			t.Fatalf("renewer never reached the stall hook")
		}
		h2.Release()            // released while renewals are stalled, before its deadline
		time.Sleep(ttl + ttl/2) // past the TTL
		// The loss is reported on time although the sender is stalled.
		select {
		case <-h1.Done():
		default:
			t.Fatalf("stalled hold not reported lost past its deadline")
		}
		sent := b.cnt.evals.Load()
		stall.Store(false)
		close(resume)
		assertLost(t, h1, "stalled hold: ")
		if err := h2.Err(); err != nil {
			t.Fatalf("hold released during the stall: Err() = %v, want nil", err)
		}
		time.Sleep(50 * time.Millisecond)
		if got := b.cnt.evals.Load(); got != sent {
			t.Errorf("renewals sent after the stall = %d, want 0", got-sent)
		}
	})
}

// TestCloseEndsHoldsAndGoroutine is not parallel: it counts goroutines.
func TestCloseEndsHoldsAndGoroutine(t *testing.T) {
	eachBackend(t, false, func(t *testing.T, b *backend) {
		const ttl = time.Second
		specs := make([]renew.Spec, 50)
		for i := range specs {
			specs[i] = acquire(t, b, ttl)
		}
		base := clientGoroutines()

		r := renew.New(b.rdb, renew.LostError(errTestLost))
		holds := make([]*renew.Hold, len(specs))
		for i, s := range specs {
			holds[i] = r.Add(s)
		}
		time.Sleep(ttl/3 + 100*time.Millisecond) // one tick
		dones := make([]<-chan struct{}, len(holds))
		for i, h := range holds[:25] {
			dones[i] = h.Done() // half of them ask for Done before Close
		}
		r.Close()
		r.Close() // idempotent
		for i, h := range holds {
			if dones[i] == nil {
				dones[i] = h.Done()
			}
			select {
			case <-dones[i]:
			default:
				t.Fatalf("hold %d: Done not closed after Close", i)
			}
			if err := h.Err(); err != nil {
				t.Fatalf("hold %d: Err() after Close = %v, want nil", i, err)
			}
		}
		if got := r.Len(); got != 0 {
			t.Errorf("Len() after Close = %d, want 0", got)
		}
		late := r.Add(acquire(t, b, ttl))
		select {
		case <-late.Done():
		default:
			t.Fatalf("Add after Close: Done not closed")
		}
		if err := late.Err(); err != nil {
			t.Errorf("Add after Close: Err() = %v, want nil", err)
		}

		n := clientGoroutines()
		for i := 0; i < 200 && n > base; i++ {
			time.Sleep(10 * time.Millisecond)
			n = clientGoroutines()
		}
		if n > base {
			t.Errorf("goroutines after Close = %d, want at most %d\n%s", n, base, stacks())
		}
	})
}

// clientGoroutines is runtime.NumGoroutine less the goroutines of an
// in-process miniredis, which come and go with its connections.
func clientGoroutines() int {
	n := runtime.NumGoroutine()
	for _, g := range strings.Split(stacks(), "\n\n") {
		if strings.Contains(g, "alicebob/miniredis") {
			n--
		}
	}
	return n
}

func stacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// A renewal that finds the hold gone while a release of it is under way
// (Releasing) leaves the end to the release: Release keeps Err nil, and
// with no outcome (the last release over, the hold live) the finding
// stands. Two releases under way: the finding waits for both.
func TestReleasingLeavesAGoneHoldToTheRelease(t *testing.T) {
	gone := func(t *testing.T, b *backend, r *renew.Renewer, s renew.Spec) {
		t.Helper()
		if err := b.probe.Del(context.Background(), s.Keys[0]).Err(); err != nil {
			t.Fatal(err)
		}
		renew.RenewAllNow(r) // returns once the renewal's reply is taken in
	}
	t.Run("released", func(t *testing.T) {
		eachHeld(t, 10*time.Second, func(t *testing.T, b *backend, r *renew.Renewer, s renew.Spec, h *renew.Hold) {
			h.Releasing(true)
			gone(t, b, r, s)
			assertLive(t, h)
			h.Release()
			h.Releasing(false)
			waitDone(t, h, time.Second)
			if err := h.Err(); err != nil {
				t.Fatalf("Err() = %v after Release, want nil", err)
			}
		})
	})
	t.Run("no outcome", func(t *testing.T) {
		eachHeld(t, 10*time.Second, func(t *testing.T, b *backend, r *renew.Renewer, s renew.Spec, h *renew.Hold) {
			h.Releasing(true)
			h.Releasing(true)
			gone(t, b, r, s)
			h.Releasing(false)
			assertLive(t, h)
			h.Releasing(false)
			waitDone(t, h, time.Second)
			assertLost(t, h, "")
		})
	})
	t.Run("still held", func(t *testing.T) {
		// A release under way, and no renewal finds the hold gone: when
		// it is over, the hold lives on and is renewed.
		eachHeld(t, 10*time.Second, func(t *testing.T, b *backend, r *renew.Renewer, s renew.Spec, h *renew.Hold) {
			h.Releasing(true)
			renew.RenewAllNow(r)
			h.Releasing(false)
			renew.RenewAllNow(r)
			assertLive(t, h)
		})
	})
	t.Run("deadline", func(t *testing.T) {
		// No outcome ever comes: the hold, renewed no more, is lost at
		// its deadline.
		eachHeld(t, time.Second, func(t *testing.T, b *backend, r *renew.Renewer, s renew.Spec, h *renew.Hold) {
			h.Releasing(true)
			gone(t, b, r, s)
			assertLive(t, h)
			at := waitDone(t, h, 10*time.Second)
			assertLost(t, h, "")
			if at.Before(s.Start.Add(time.Second - drift(time.Second))) {
				t.Fatalf("lost %v after Start, before its deadline", at.Sub(s.Start))
			}
		})
	})
}
