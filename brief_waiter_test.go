package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A waiter whose TTL is below 200 ms is not handed the hold a release
// frees: the hold would last that TTL from the release and could end
// before a slow waiter learns of it, which then starts again at the back
// of the queue, every time. The release leaves it first in line and tells
// it to try again; its own attempt takes the hold. These tests hold such a
// waiter's script calls back at the moment of the release (as a waiter
// that is slow to run) and judge by what Redis holds.

// A briefKind is a primitive as these tests see it: its holds, whether
// Redis has one, and how many calls its queue holds.
type briefKind struct {
	name   string
	hold   holdKind
	held   func(ctx context.Context, rdb redis.UniversalClient, name string) (bool, error)
	queued func(ctx context.Context, rdb redis.UniversalClient, name string) (int64, error)
}

var briefKinds = []briefKind{
	{"Mutex", mutexHold,
		func(ctx context.Context, rdb redis.UniversalClient, name string) (bool, error) {
			n, err := rdb.Exists(ctx, mutexKeys(name).Lock).Result()
			return n == 1, err
		},
		func(ctx context.Context, rdb redis.UniversalClient, name string) (int64, error) {
			return rdb.ZCard(ctx, mutexKeys(name).Queue).Result()
		}},
	{"RWMutexWriter", writeHold,
		func(ctx context.Context, rdb redis.UniversalClient, name string) (bool, error) {
			n, err := rdb.Exists(ctx, rwk(name).Writer).Result()
			return n == 1, err
		},
		func(ctx context.Context, rdb redis.UniversalClient, name string) (int64, error) {
			return rdb.ZCard(ctx, rwk(name).WriterQueue).Result()
		}},
	{"Semaphore", semHold(1, 1),
		func(ctx context.Context, rdb redis.UniversalClient, name string) (bool, error) {
			n, err := rdb.ZCard(ctx, semKeys(name).Holders).Result()
			return n > 0, err
		},
		func(ctx context.Context, rdb redis.UniversalClient, name string) (int64, error) {
			return rdb.ZCard(ctx, semKeys(name).Queue).Result()
		}},
}

// placeMargin is how long after a waiter's last attempt the tests count on
// its queue place (200 ms at least) to live: a round in which the release,
// or a check that needs the place, came later is not counted, and another
// round runs on a fresh name.
const placeMargin = 150 * time.Millisecond

// briefRound is one try of a test that needs a waiter's place to live
// through a release: it reports whether its timing held (see placeMargin).
type briefRound func(t *testing.T, b redistest.Backend, ctx context.Context, k briefKind, name string) bool

// briefRounds runs round on every backend and kind until one round's
// timing held, five at most.
func briefRounds(t *testing.T, round briefRound) {
	for _, k := range briefKinds {
		t.Run(k.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b redistest.Backend) {
				for i := range 5 {
					if round(t, b, ctxT(t), k, redistest.Key(t)+string(rune('a'+i))) {
						return
					}
					if t.Failed() {
						return
					}
					t.Logf("round %d: the release came more than %v after the waiter's last attempt; again", i, placeMargin)
				}
				t.Fatalf("no round in 5 released the name within %v of the waiter's last attempt", placeMargin)
			})
		})
	}
}

// queueWaiter starts a waiting call, with TTL ttl, on name held by hold
// through a Client whose script calls go through g, and waits until it is
// queued.
func queueWaiter(t *testing.T, b redistest.Backend, ctx context.Context, k briefKind, rdb redis.UniversalClient, name string, ttl time.Duration, g *scriptGate) (holdCalls, context.Context, *waiterCall) {
	t.Helper()
	wc, _ := hookedClient(t, b, g, dsync.TTL(ttl))
	w := k.hold(wc, name)
	wctx, cancel := context.WithCancel(dsync.WithOwner(ctx))
	t.Cleanup(cancel)
	got := async(func() error { return w.lock(wctx) })
	waitFor(t, 5*time.Second, "the waiter queued", func() bool {
		n, err := k.queued(ctx, rdb, name)
		must(t, err)
		return n == 1
	})
	return w, wctx, &waiterCall{got, cancel, g}
}

// A waiterCall is the Lock call of a held-back waiter (see queueWaiter).
type waiterCall struct {
	got    <-chan error
	cancel context.CancelFunc
	g      *scriptGate
}

// end cancels the call, lets its script calls through (its clean-up
// included) and waits for it to return.
func (w *waiterCall) end(t *testing.T) {
	w.cancel()
	w.g.open()
	select {
	case <-w.got:
	case <-time.After(10 * time.Second):
		t.Error("a cancelled Lock did not return in 10 s")
	}
}

func TestBriefWaiterTakesTheHoldItself(t *testing.T) {
	briefRounds(t, func(t *testing.T, b redistest.Backend, ctx context.Context, k briefKind, name string) bool {
		rdb := b.NewClient(t)
		a := k.hold(newClient(t, b), name)
		actx := dsync.WithOwner(ctx)
		la := lockLeaseOf(t, actx, a, "first hold")
		g := &scriptGate{pipes: true}
		defer g.open()
		w, wctx, got := queueWaiter(t, b, ctx, k, rdb, name, 150*time.Millisecond, g)

		g.close()
		last := g.lastCall()
		must(t, a.unlock(actx))
		held, err := k.held(ctx, rdb, name)
		must(t, err)
		queued, err := k.queued(ctx, rdb, name)
		must(t, err)
		if time.Since(last) > placeMargin {
			got.end(t)
			return false
		}
		if held {
			t.Fatal("the release handed its hold to a waiter whose TTL (150 ms) is below 200 ms")
		}
		if queued != 1 {
			t.Fatalf("after the release the queue holds %d calls, want the waiter, first in line", queued)
		}
		// First in line, free for the waiter alone.
		other := k.hold(newClient(t, b), name)
		ok, err := other.try(dsync.WithOwner(ctx))
		must(t, err)
		if time.Since(last) > placeMargin {
			got.end(t)
			return false
		}
		if ok {
			t.Fatal("another caller took the name the release left to the waiter first in line")
		}

		// Longer than the waiter's TTL: a hold handed over would be gone.
		time.Sleep(300 * time.Millisecond)
		g.open()
		recvNil(t, got.got, 10*time.Second, "the waiter's Lock")
		lw, err := w.lease(wctx)
		must(t, err)
		if lw.Token() <= la.Token() {
			t.Errorf("waiter's fencing token %d, want above the first hold's %d", lw.Token(), la.Token())
		}
		held, err = k.held(ctx, rdb, name)
		must(t, err)
		if !held && lw.Err() == nil {
			t.Error("the waiter's Lock returned and its lease is live, but Redis holds nothing")
		}
		_ = w.unlock(wctx) // a 150 ms lease may be gone by now
		return true
	})
}

// A waiter whose TTL is 200 ms or more is still handed the hold: Redis
// holds it for the waiter as the release returns, before any attempt of
// the waiter's.
func TestWaiterWithLongerTTLIsHandedTheHold(t *testing.T) {
	briefRounds(t, func(t *testing.T, b redistest.Backend, ctx context.Context, k briefKind, name string) bool {
		rdb := b.NewClient(t)
		a := k.hold(newClient(t, b), name)
		actx := dsync.WithOwner(ctx)
		la := lockLeaseOf(t, actx, a, "first hold")
		g := &scriptGate{pipes: true}
		defer g.open()
		w, wctx, got := queueWaiter(t, b, ctx, k, rdb, name, 300*time.Millisecond, g)

		g.close()
		last := g.lastCall()
		must(t, a.unlock(actx))
		held, err := k.held(ctx, rdb, name)
		must(t, err)
		queued, err := k.queued(ctx, rdb, name)
		must(t, err)
		if time.Since(last) > placeMargin {
			got.end(t)
			return false
		}
		if !held || queued != 0 {
			t.Fatalf("after the release: held %v, %d queued; want the hold handed to the waiter (TTL 300 ms), none queued", held, queued)
		}
		g.open()
		recvNil(t, got.got, 10*time.Second, "the waiter's Lock")
		lw, err := w.lease(wctx)
		must(t, err)
		if lw.Token() <= la.Token() {
			t.Errorf("waiter's fencing token %d, want above the first hold's %d", lw.Token(), la.Token())
		}
		// Its lease is measured from its last attempt, up to 150 ms before
		// the release: a machine that stalls may see it lost by now.
		if err := w.unlock(wctx); err != nil && !errors.Is(err, dsync.ErrLeaseLost) {
			t.Errorf("the waiter's Unlock: %v", err)
		}
		return true
	})
}

// A briefScene is a name held by a, a waiter with a 150 ms TTL queued
// behind it whose script calls go through g, and a second waiter queued
// behind that one.
type briefScene struct {
	a       holdCalls
	actx    context.Context
	g       *scriptGate
	got     *waiterCall
	next    holdCalls
	nctx    context.Context
	gotNext <-chan error
}

// newBriefScene sets up a briefScene on name; the second waiter's Client
// has the options opts.
func newBriefScene(t *testing.T, b redistest.Backend, ctx context.Context, k briefKind, rdb redis.UniversalClient, name string, opts ...dsync.Option) *briefScene {
	t.Helper()
	s := &briefScene{a: k.hold(newClient(t, b), name), actx: dsync.WithOwner(ctx), g: &scriptGate{pipes: true}}
	must(t, s.a.lock(s.actx))
	t.Cleanup(s.g.open)
	_, _, s.got = queueWaiter(t, b, ctx, k, rdb, name, 150*time.Millisecond, s.g)
	s.next, s.nctx = k.hold(newClient(t, b, opts...), name), dsync.WithOwner(ctx)
	s.gotNext = async(func() error { return s.next.lock(s.nctx) })
	waitFor(t, 5*time.Second, "the second waiter queued", func() bool {
		n, err := k.queued(ctx, rdb, name)
		must(t, err)
		return n == 2
	})
	return s
}

// release holds the first waiter's script calls back from now on, ends
// a's hold, and returns when the first waiter's last script call went out.
func (s *briefScene) release(t *testing.T) time.Time {
	t.Helper()
	s.g.close()
	last := s.g.lastCall()
	must(t, s.a.unlock(s.actx))
	return last
}

// drop ends both waiting calls of a round whose timing did not hold.
func (s *briefScene) drop(t *testing.T) {
	s.got.end(t)
	if err := <-s.gotNext; err == nil {
		_ = s.next.unlock(s.nctx)
	}
}

// A waiter with a short TTL that a release left first in line, and that
// never comes back for the hold (dead, or held back for good), delays the
// others until its place lapses (200 ms after its last attempt), no more:
// a caller waiting behind it gets the name, and the dead waiter never
// holds it.
func TestDeadBriefWaiterDelaysOthersByItsPlace(t *testing.T) {
	briefRounds(t, func(t *testing.T, b redistest.Backend, ctx context.Context, k briefKind, name string) bool {
		rdb := b.NewClient(t)
		s := newBriefScene(t, b, ctx, k, rdb, name)
		last := s.release(t) // the first waiter attempts no more
		held, err := k.held(ctx, rdb, name)
		must(t, err)
		if time.Since(last) > placeMargin {
			s.drop(t)
			return false
		}
		if held {
			t.Fatal("the release handed its hold to a waiter whose TTL (150 ms) is below 200 ms")
		}
		start := time.Now()
		recvNil(t, s.gotNext, 10*time.Second, "the Lock behind the dead waiter")
		t.Logf("the Lock behind the dead waiter got the name %v after the release", time.Since(start).Round(time.Millisecond))
		if held, err := k.held(ctx, rdb, name); err != nil || !held {
			t.Fatalf("the second waiter's Lock returned, Redis holds %v (%v)", held, err)
		}
		select {
		case err := <-s.got.got:
			t.Fatalf("the held-back waiter's Lock returned %v while none of its script calls ran", err)
		default:
		}
		must(t, s.next.unlock(s.nctx))
		s.got.end(t)
		return true
	})
}

// A waiter with a 150 ms TTL that a release left first in line gives up
// (its ctx cancelled) before its own attempt: the next waiter (10 s TTL)
// is woken by the abandon's clean-up and takes the free name, well before
// the brief waiter's place would have lapsed (200 ms from its last
// attempt); a round counts only when the release came within 60 ms of
// that attempt.
func TestAbandonedBriefWaiterWakesTheNext(t *testing.T) {
	briefRounds(t, func(t *testing.T, b redistest.Backend, ctx context.Context, k briefKind, name string) bool {
		s := newBriefScene(t, b, ctx, k, b.NewClient(t), name, dsync.TTL(10*time.Second))
		last := s.release(t)
		if time.Since(last) > 60*time.Millisecond {
			s.drop(t)
			return false
		}
		start := time.Now()
		s.got.end(t) // cancelled: its clean-up runs
		recvNil(t, s.gotNext, 10*time.Second, "the Lock behind the abandoned brief waiter")
		d := time.Since(start)
		left := 200*time.Millisecond - start.Sub(last)
		t.Logf("the next waiter took the name %v after the brief waiter gave up (its place had %v left)", d.Round(time.Millisecond), left.Round(time.Millisecond))
		if d > left-20*time.Millisecond && d > 60*time.Millisecond {
			t.Errorf("the next waiter took the name %v after the brief waiter gave up, with its place %v from lapsing: the abandon did not wake it", d, left)
		}
		must(t, s.next.unlock(s.nctx))
		return true
	})
}
