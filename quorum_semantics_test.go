package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// DESIGN's Semantics sentences that apply to quorum mode, each checked on a
// Quorum of three masters.

// A qKind is one kind of hold a Quorum gives: the owner's lock and unlock
// of handle h, another process's try of a conflicting hold, and the scripts
// they run.
type qKind struct {
	name             string
	lock, unlock     func(h any) func(context.Context) error
	try              func(h any) func(context.Context) (bool, error)
	lease            func(h any) func(context.Context) (*dsync.Lease, error)
	handle           func(q *dsync.Quorum, name string, opts ...dsync.Option) any
	lockScr, unlkScr string
}

func qKinds() []qKind {
	mu := func(q *dsync.Quorum, name string, opts ...dsync.Option) any { return q.Mutex(name, opts...) }
	rw := func(q *dsync.Quorum, name string, opts ...dsync.Option) any { return q.RWMutex(name, opts...) }
	return []qKind{
		{name: "Mutex", handle: mu, lockScr: "mutex_lock", unlkScr: "mutex_unlock",
			lock:   func(h any) func(context.Context) error { return h.(*dsync.Mutex).Lock },
			unlock: func(h any) func(context.Context) error { return h.(*dsync.Mutex).Unlock },
			try:    func(h any) func(context.Context) (bool, error) { return h.(*dsync.Mutex).TryLock },
			lease:  func(h any) func(context.Context) (*dsync.Lease, error) { return h.(*dsync.Mutex).Lease }},
		{name: "RWMutex write", handle: rw, lockScr: "rwmutex_lock", unlkScr: "rwmutex_unlock",
			lock:   func(h any) func(context.Context) error { return h.(*dsync.RWMutex).Lock },
			unlock: func(h any) func(context.Context) error { return h.(*dsync.RWMutex).Unlock },
			try:    func(h any) func(context.Context) (bool, error) { return h.(*dsync.RWMutex).TryLock },
			lease:  func(h any) func(context.Context) (*dsync.Lease, error) { return h.(*dsync.RWMutex).Lease }},
		{name: "RWMutex read", handle: rw, lockScr: "rwmutex_lock", unlkScr: "rwmutex_unlock",
			lock:   func(h any) func(context.Context) error { return h.(*dsync.RWMutex).RLock },
			unlock: func(h any) func(context.Context) error { return h.(*dsync.RWMutex).RUnlock },
			// A writer conflicts with a reader.
			try:   func(h any) func(context.Context) (bool, error) { return h.(*dsync.RWMutex).TryLock },
			lease: func(h any) func(context.Context) (*dsync.Lease, error) { return h.(*dsync.RWMutex).RLease }},
	}
}

// otherTry reports whether another process (a Quorum of its own) gets a
// hold of k's name that conflicts with k's, and gives it back.
func (k qKind) otherTry(t *testing.T, ctx context.Context, rdbs []redis.UniversalClient, name string) bool {
	t.Helper()
	h := k.handle(newQuorum(t, rdbs), name)
	ok, err := k.try(h)(ctx)
	if err != nil {
		t.Fatalf("another process's TryLock: %v", err)
	}
	if ok {
		if k.name == "RWMutex read" {
			must(t, h.(*dsync.RWMutex).Unlock(ctx))
		} else {
			must(t, k.unlock(h)(ctx))
		}
	}
	return ok
}

// Idempotence: an Unlock names the hold it ends, on every master, so a late
// copy of it cannot end a later hold of the same owner, however late it
// arrives (here after the replay window: the call ids are forgotten).
func TestQuorumLateUnlockEndsNoLaterHold(t *testing.T) {
	for _, k := range qKinds() {
		t.Run(k.name, func(t *testing.T) {
			var bs []redistest.Backend
			for range 3 {
				bs = append(bs, redistest.Miniredis(t))
			}
			e := contractEnv{members: bs, quorum: true}
			name := redistest.Key(t)
			ctx := ctxT(t)
			octx := dsync.WithOwner(ctx)
			var rdbs []redis.UniversalClient
			for _, b := range bs {
				rdbs = append(rdbs, b.NewClient(t))
			}
			// Leases far longer than the clocks are moved below.
			c, ms := e.recorded(t)
			h := k.handle(c.(*dsync.Quorum), name, dsync.TTL(time.Hour))
			must(t, k.lock(h)(octx))
			_, _, copies := recordCall(t, ms, k.unlkScr, func() (bool, func(context.Context) error, error) {
				return true, nil, k.unlock(h)(octx)
			})
			must(t, k.lock(h)(octx)) // the owner's next hold
			for _, b := range bs {
				b.Advance(2 * time.Minute) // past the replay window
			}
			for i, args := range copies {
				if err := ms[i].rdb.Do(ctx, args...).Err(); err != nil {
					t.Fatalf("late Unlock copy on master %d: %v", i, err)
				}
			}
			if k.otherTry(t, ctx, rdbs, name) {
				t.Fatal("another process got in: the late copy of the first Unlock ended the owner's next hold")
			}
			l, err := k.lease(h)(octx)
			must(t, err)
			if err := l.Err(); err != nil {
				t.Fatalf("the owner's next hold: Lease.Err = %v, want nil", err)
			}
			must(t, k.unlock(h)(octx))
		})
	}
}

// countedQuorum returns a Quorum over the masters rdbs, and a Counter of
// the commands it sends to each (Pub/Sub included).
func countedQuorum(t *testing.T, bs []redistest.Backend, opts ...dsync.Option) (*dsync.Quorum, []*redistest.Counter) {
	t.Helper()
	var rdbs []redis.UniversalClient
	var cs []*redistest.Counter
	for _, b := range bs {
		rdb, c := b.NewClient(t), &redistest.Counter{}
		rdb.AddHook(c)
		rdbs, cs = append(rdbs, rdb), append(cs, c)
	}
	return newQuorum(t, rdbs, opts...), cs
}

// qMaxTrips is how many round trips a waiter may make to one master in d:
// one attempt per 20 ms (engine.go's minRetry) and its undo, plus a few
// for the first attempts, script loads and the final undo.
func qMaxTrips(d time.Duration) int64 { return 2*int64(d/(20*time.Millisecond)) + 10 }

// Waiting: whatever Redis holds, no waiter retries more often than every
// few tens of ms. Two other processes hold the name on one master each
// (single-node Clients): every attempt of a quorum waiter is granted by the
// third master only, a split vote, and undone, until its ctx ends.
func TestQuorumSplitVotesRetryNoFasterThanFloor(t *testing.T) {
	bs := []redistest.Backend{redistest.Miniredis(t), redistest.Miniredis(t), redistest.Miniredis(t)}
	ctx := ctxT(t)
	name := redistest.Key(t)
	for i := range 2 {
		c := newClient(t, bs[i])
		must(t, c.Mutex(name).Lock(ctx))
	}
	q, cs := countedQuorum(t, bs)
	const wait = 800 * time.Millisecond
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	start := time.Now()
	err := q.Mutex(name).Lock(wctx)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock with the masters split = %v, want DeadlineExceeded", err)
	}
	if n, max := cs[2].RoundTrips(), qMaxTrips(took); n > max {
		t.Errorf("the waiter sent %d commands to the granting master in %v, want at most %d: a busy loop", n, took.Round(time.Millisecond), max)
	}
	dsync.WaitCleanups(q)
	assertNoLockKeys(t, bs[2], name)
}

// Waiting: a notification is a hint. PUBLISHes on a quorum waiter's
// channel on every master, plain releases and forged hand-overs, wake it
// but grant it nothing, and however many arrive it attempts at most every
// few tens of ms; the real release then lets it in.
func TestQuorumForgedNotificationsGrantNothing(t *testing.T) {
	for _, k := range qKinds() {
		t.Run(k.name, func(t *testing.T) {
			bs := []redistest.Backend{redistest.Miniredis(t), redistest.Miniredis(t), redistest.Miniredis(t)}
			ctx := ctxT(t)
			name := redistest.Key(t)
			var rdbs []redis.UniversalClient
			for _, b := range bs {
				rdbs = append(rdbs, b.NewClient(t))
			}
			holder := k.handle(newQuorum(t, rdbs), name)
			// A writer holds: it excludes readers and writers.
			hold, unhold := k.lock, k.unlock
			if k.name == "RWMutex read" {
				hold = func(h any) func(context.Context) error { return h.(*dsync.RWMutex).Lock }
				unhold = func(h any) func(context.Context) error { return h.(*dsync.RWMutex).Unlock }
			}
			must(t, hold(holder)(ctx))
			q, cs := countedQuorum(t, bs)
			h := k.handle(q, name)
			got := make(chan error, 1)
			go func() { got <- k.lock(h)(ctx) }()
			ch := mutexKeys(name).Channel()
			if k.name != "Mutex" {
				ch = rwk(name).Channel()
			}
			const flood = 600 * time.Millisecond
			start := time.Now()
			for i := 0; time.Since(start) < flood; i++ {
				for _, rdb := range rdbs {
					for _, msg := range []string{"", "x y 424242 z", "9223372036854775808"} {
						must(t, rdb.Publish(ctx, ch, msg).Err())
					}
				}
				select {
				case err := <-got:
					t.Fatalf("the waiter returned (%v) after %d rounds of PUBLISHes while the name was held", err, i+1)
				case <-time.After(2 * time.Millisecond):
				}
			}
			took := time.Since(start)
			for i, c := range cs {
				// Subscriptions count too; attempts are what matter.
				if n, max := c.RoundTrips(), qMaxTrips(took); n > max {
					t.Errorf("master %d: the waiter sent %d commands in %v of PUBLISHes, want at most %d", i, n, took.Round(time.Millisecond), max)
				}
			}
			must(t, unhold(holder)(ctx))
			select {
			case err := <-got:
				must(t, err)
			case <-time.After(5 * time.Second):
				t.Fatal("the waiter did not get in after the release")
			}
			must(t, k.unlock(h)(ctx))
		})
	}
}

// pausableMasters starts n independent servers that a test can pause, with
// a client of each on go-redis's defaults: reads last until ReadTimeout,
// whatever the ctx.
func pausableMasters(t *testing.T, n int) ([]*pausable, []redis.UniversalClient) {
	var ps []*pausable
	var rdbs []redis.UniversalClient
	for range n {
		p := newPausable(t)
		ps = append(ps, p)
		rdb := redis.NewClient(&redis.Options{Addr: p.s.Addr()})
		t.Cleanup(func() { rdb.Close() })
		rdbs = append(rdbs, rdb)
	}
	return ps, rdbs
}

// Deadlines: with one master of three paused (CLIENT PAUSE: busy, or its
// network holding replies), a Lock of a held name returns at its ctx's end,
// and one of a free name is granted by the two others at once (Redlock
// gives up on a slow master), not at its ctx's end; the undo of its attempt
// on the paused master is left to the background, and once that master
// answers again nothing of the call is left anywhere.
func TestQuorumDeadlineWithMasterPaused(t *testing.T) {
	for _, held := range []bool{false, true} {
		what := "free"
		if held {
			what = "held"
		}
		t.Run(what, func(t *testing.T) {
			ps, rdbs := pausableMasters(t, 3)
			ctx := ctxT(t)
			name := redistest.Key(t)
			q := newQuorum(t, rdbs)
			m := q.Mutex(name)
			// Load the scripts; the holder, if any, is another process.
			must(t, m.Lock(ctx))
			must(t, m.Unlock(ctx))
			other := newQuorum(t, rdbs).Mutex(name)
			if held {
				must(t, other.Lock(ctx))
			}
			ps[0].pause(t)
			// A free name's Lock must not wait for the paused master: its
			// ctx would end after the pause.
			wait := cancelAfter
			if !held {
				wait = pauseFor * 3 / 4
			}
			cctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			start := time.Now()
			err := m.Lock(cctx)
			took := time.Since(start)
			if took > cancelAfter+slack {
				t.Errorf("Lock with a master paused returned after %v (%v), want within %v", took, err, cancelAfter+slack)
			}
			switch {
			case held && !errors.Is(err, context.DeadlineExceeded):
				t.Errorf("Lock of a held name = %v, want DeadlineExceeded", err)
			case !held && err != nil:
				t.Errorf("Lock of a free name = %v, want nil", err)
			case err == nil:
				if ok, err := other.TryLock(ctx); ok || err != nil {
					t.Errorf("another process's TryLock while held = %v, %v; want false, nil", ok, err)
				}
				must(t, m.Unlock(ctx))
			}
			if held {
				must(t, other.Unlock(ctx))
			}
			dsync.WaitCleanups(q)
			for i, rdb := range rdbs {
				if n, err := rdb.Exists(ctx, mutexKeys(name).Lock).Result(); n != 0 || err != nil {
					t.Errorf("master %d: lock key exists = %d, %v after every call ended; want 0", i, n, err)
				}
			}
		})
	}
}

// miniQuorumEnv returns three miniredis masters, a plain client of each,
// and the Client of a Quorum over them made with opts.
func miniQuorumEnv(t *testing.T, opts ...dsync.Option) ([]redistest.Backend, []redis.UniversalClient, *dsync.Quorum) {
	t.Helper()
	bs := []redistest.Backend{redistest.Miniredis(t), redistest.Miniredis(t), redistest.Miniredis(t)}
	var rdbs []redis.UniversalClient
	for _, b := range bs {
		rdbs = append(rdbs, b.NewClient(t))
	}
	return bs, rdbs, newQuorum(t, rdbs, opts...)
}

// Reentrancy and Waiting: two goroutines of one owner that wait both get
// in when the name is released, as two levels of one hold; the first
// Unlock leaves it held.
func TestQuorumOwnerWaitingInTwoGoroutines(t *testing.T) {
	for _, k := range qKinds() {
		t.Run(k.name, func(t *testing.T) {
			bs, rdbs, _ := miniQuorumEnv(t)
			q, cs := countedQuorum(t, bs)
			ctx := ctxT(t)
			name := redistest.Key(t)
			// A writer holds: it excludes readers and writers.
			holder := newQuorum(t, rdbs).RWMutex(name)
			hold, unhold := holder.Lock, holder.Unlock
			if k.name == "Mutex" {
				m := newQuorum(t, rdbs).Mutex(name)
				hold, unhold = m.Lock, m.Unlock
			}
			must(t, hold(ctx))
			octx := dsync.WithOwner(ctx)
			h := k.handle(q, name)
			errs := make(chan error, 2)
			for range 2 {
				go func() { errs <- k.lock(h)(octx) }()
			}
			// Both were refused twice: before and after subscribing.
			waitFor(t, 5*time.Second, "two refused calls", func() bool { return cs[0].RoundTrips() >= 4 })
			must(t, unhold(ctx))
			for range 2 {
				select {
				case err := <-errs:
					must(t, err)
				case <-time.After(5 * time.Second):
					t.Fatal("a goroutine of the owner did not get in after the release")
				}
			}
			must(t, k.unlock(h)(octx))
			if k.otherTry(t, ctx, rdbs, name) {
				t.Fatal("another process got in after one of the owner's two Unlocks")
			}
			must(t, k.unlock(h)(octx))
			if !k.otherTry(t, ctx, rdbs, name) {
				t.Fatal("another process did not get in after both Unlocks")
			}
		})
	}
}

// Leases: a re-entry through a handle with a shorter TTL never moves the
// expiry that the masters keep for the hold earlier.
func TestQuorumReentryNeverShortensExpiry(t *testing.T) {
	for _, k := range qKinds()[:2] {
		t.Run(k.name, func(t *testing.T) {
			_, rdbs, q := miniQuorumEnv(t)
			ctx := ctxT(t)
			name := redistest.Key(t)
			octx := dsync.WithOwner(ctx)
			long, short := k.handle(q, name, dsync.TTL(30*time.Second)), k.handle(q, name, dsync.TTL(200*time.Millisecond))
			must(t, k.lock(long)(octx))
			must(t, k.lock(short)(octx))
			key := mutexKeys(name).Lock
			if k.name != "Mutex" {
				key = rwk(name).Writer
			}
			for i, rdb := range rdbs {
				if d, err := rdb.PTTL(ctx, key).Result(); err != nil || d < 20*time.Second {
					t.Errorf("master %d: PTTL after a re-entry with TTL 200ms = %v, %v; want the hold's 30s", i, d, err)
				}
			}
			must(t, k.unlock(short)(octx))
			must(t, k.unlock(long)(octx))
		})
	}
}

// Leases and Ownership: a hold whose keys are deleted (or whose master
// restarted empty) on one master of three lives on, and nobody else gets
// in; deleted on a second master it is lost and its Lease says so. The
// handle without an owner that took it stays locked until its Unlock,
// which reports the loss and leaves the next holder's hold alone, and the
// lost Lease keeps reporting ErrLeaseLost.
func TestQuorumKeysDeletedBehindHolder(t *testing.T) {
	for _, k := range qKinds()[:2] {
		t.Run(k.name, func(t *testing.T) {
			const ttl = time.Second
			_, rdbs, q := miniQuorumEnv(t, dsync.TTL(ttl))
			ctx := ctxT(t)
			name := redistest.Key(t)
			h := k.handle(q, name)
			must(t, k.lock(h)(ctx))
			l, err := k.lease(h)(ctx)
			must(t, err)
			must(t, rdbs[0].FlushAll(ctx).Err()) // as a restart without persistence
			select {
			case <-l.Done():
				t.Fatalf("lease ended with 2 of 3 masters holding: %v", l.Err())
			case <-time.After(ttl): // three renewals
			}
			if k.otherTry(t, ctx, rdbs, name) {
				t.Fatal("another process got in while 2 of 3 masters hold the name")
			}
			must(t, rdbs[1].FlushAll(ctx).Err())
			select {
			case <-l.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("lease not lost with 1 of 3 masters holding")
			}
			if err := l.Err(); !errors.Is(err, dsync.ErrLeaseLost) {
				t.Fatalf("Lease.Err = %v, want ErrLeaseLost", err)
			}
			// The handle stays locked although two masters are free.
			wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			err = k.lock(h)(wctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("second Lock through the handle after the loss = %v, want DeadlineExceeded", err)
			}
			other := k.handle(newQuorum(t, rdbs), name)
			must(t, k.lock(other)(ctx))
			if err := k.unlock(h)(ctx); !errors.Is(err, dsync.ErrLeaseLost) {
				t.Fatalf("Unlock of the lost hold = %v, want ErrLeaseLost", err)
			}
			if k.otherTry(t, ctx, rdbs, name) {
				t.Fatal("a third process got in: the lost hold's Unlock released the next holder's hold")
			}
			must(t, k.unlock(other)(ctx))
			must(t, k.lock(h)(ctx))
			if err := l.Err(); !errors.Is(err, dsync.ErrLeaseLost) {
				t.Fatalf("lost Lease Err after the handle locked again = %v, want ErrLeaseLost", err)
			}
			must(t, k.unlock(h)(ctx))
		})
	}
}

// A waiting reader is granted the read hold by a writer's Unlock on each
// master, and those holds end (their keys deleted) on two masters before
// its next attempt: its call is over there, as far as those masters know.
// It starts again there under a new call id and gets in, instead of being
// refused under its old one until its ctx ends.
func TestQuorumWaiterWhoseGrantEndedStartsAgain(t *testing.T) {
	bs, rdbs, _ := miniQuorumEnv(t)
	ctx := ctxT(t)
	name := redistest.Key(t)
	writer := newQuorum(t, rdbs).RWMutex(name)
	must(t, writer.Lock(ctx))
	// The reader's attempts wait at a gate while the test deletes.
	var rrdbs []redis.UniversalClient
	var gates []*unlockGate
	for _, b := range bs {
		g := &unlockGate{sha: lua.Script("rwmutex_lock").Hash()}
		rdb := b.NewClient(t)
		rdb.AddHook(g)
		rrdbs, gates = append(rrdbs, rdb), append(gates, g)
	}
	rw := newQuorum(t, rrdbs, dsync.TTL(time.Second)).RWMutex(name)
	got := make(chan error, 1)
	rctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	go func() { got <- rw.RLock(rctx) }()
	k := rwk(name)
	waitFor(t, 5*time.Second, "a waiting reader on every master", func() bool {
		for _, rdb := range rdbs {
			if n, _ := rdb.Exists(ctx, k.WaitingReaders).Result(); n == 0 {
				return false
			}
		}
		return true
	})
	for _, g := range gates {
		g.close()
	}
	must(t, writer.Unlock(ctx)) // grants the waiting reader on every master
	for _, rdb := range rdbs[:2] {
		must(t, rdb.Del(ctx, k.Readers, k.ReaderData).Err())
	}
	for _, g := range gates {
		g.open()
	}
	if err := <-got; err != nil {
		t.Fatalf("RLock after its grants ended on two masters = %v, want nil", err)
	}
	must(t, rw.RUnlock(ctx))
}
