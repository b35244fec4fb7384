package dsync_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// Cohorts (cohort.go): Lock calls without an owner that wait for a name
// while another call of the same Client holds it or tries for it wait in
// the process, and a release passes the lock to the first of them in its
// own script. Each test judges by what Redis holds.

// passCmd reports whether cmd is a Mutex release that passes the lock (the
// unlock script with the pass arguments).
func passCmd(cmd redis.Cmder) bool {
	return cmd.Name() == "evalsha" && len(cmd.Args()) == 20
}

// fenceInRedis returns the fencing token of name's current Mutex hold as
// Redis has it, "" when there is none.
func fenceInRedis(t *testing.T, rdb redis.UniversalClient, name string) string {
	t.Helper()
	f, err := rdb.HGet(context.Background(), mutexKeys(name).Lock, ":f").Result()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return f
}

// waitingInProcess waits until n Lock calls of c wait in the process for
// name.
func waitingInProcess(t *testing.T, c *dsync.Client, name string, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, strconv.Itoa(n)+" calls waiting in the process", func() bool {
		return dsync.CohortWaiting(c, mutexKeys(name).Lock) == n
	})
}

// lockAsync starts m.Lock(ctx) and returns the channel of its result.
func lockAsync(ctx context.Context, m *dsync.Mutex) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- m.Lock(ctx) }()
	return ch
}

func TestCohortReleasePassesTheLock(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rec := &redistest.Recorder{}
		c, rdb := hookedClient(t, b, rec, dsync.FixedLease())
		a, w := c.Mutex(name), c.Mutex(name)
		la := lockLease(t, ctx, a)
		got := lockAsync(ctx, w)
		waitingInProcess(t, c, name, 1)
		rec.Reset()
		must(t, a.Unlock(ctx))
		unlocked := time.Now()
		recvNil(t, got, 10*time.Second, "the waiting Lock")
		// The release's reply gave the hold: the waiter sent no attempt.
		src, err := dsync.ScriptSource("mutex_lock")
		must(t, err)
		lockSHA, passes := redis.NewScript(src).Hash(), 0
		for _, args := range rec.All() {
			if args[1] == lockSHA {
				t.Fatalf("the waiter sent a lock attempt: %v", args)
			}
			if len(args) == 20 {
				passes++
			}
		}
		if passes == 0 {
			t.Fatalf("no passing release sent: %v", rec.All())
		}
		lw, err := w.Lease(ctx)
		must(t, err)
		if lw.Token() <= la.Token() {
			t.Fatalf("passed hold's token %d, not above the releaser's %d", lw.Token(), la.Token())
		}
		if f := fenceInRedis(t, rdb, name); f != strconv.FormatUint(lw.Token(), 10) {
			t.Fatalf("Redis holds the hold with token %q, the waiter believes %d", f, lw.Token())
		}
		// Redis started the hold's TTL before the release's reply came
		// back: the lease must not outlast that.
		if d := dsync.LeaseDeadline(lw); d.After(unlocked.Add(30 * time.Second)) {
			t.Fatalf("passed hold's lease ends %v after the release returned, later than its TTL (30s)", d.Sub(unlocked))
		}
		// Another Client finds it held, then free once the waiter unlocks.
		other := newClient(t, b).Mutex(name)
		if ok, err := other.TryLock(ctx); err != nil || ok {
			t.Fatalf("TryLock by another Client while the pass's hold lives: %v, %v", ok, err)
		}
		must(t, w.Unlock(ctx))
		if ok, err := other.TryLock(ctx); err != nil || !ok {
			t.Fatalf("TryLock after the passed hold's Unlock: %v, %v", ok, err)
		}
		must(t, other.Unlock(ctx))
	})
}

// While others are queued in Redis, a release passes the lock in the
// process at most cohortPasses (8) times in a row.
func TestCohortPassesAreBounded(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const passes, local = 8, 10
		c := newClient(t, b)
		first := c.Mutex(name)
		must(t, first.Lock(ctx))
		var (
			mu    sync.Mutex
			order []string
		)
		hold := func(m *dsync.Mutex, who string) <-chan error {
			done := make(chan error, 1)
			go func() {
				if err := m.Lock(ctx); err != nil {
					done <- err
					return
				}
				mu.Lock()
				order = append(order, who)
				mu.Unlock()
				done <- m.Unlock(ctx)
			}()
			return done
		}
		var dones []<-chan error
		for i := range local {
			dones = append(dones, hold(c.Mutex(name), "local"+strconv.Itoa(i)))
			waitingInProcess(t, c, name, i+1)
		}
		// Another process queues in Redis.
		rdb := b.NewClient(t)
		dones = append(dones, hold(newClient(t, b).Mutex(name), "other"))
		waitFor(t, 10*time.Second, "the other Client's queue place", func() bool {
			n, err := rdb.ZCard(ctx, mutexKeys(name).Queue).Result()
			return err == nil && n == 1
		})
		must(t, first.Unlock(ctx))
		for _, d := range dones {
			recvNil(t, d, 20*time.Second, "a Lock and Unlock")
		}
		want := []string{"local0", "local1", "local2", "local3", "local4", "local5", "local6", "local7", "other", "local8", "local9"}
		if len(order) != len(want) {
			t.Fatalf("order of holds %v, want %v", order, want)
		}
		for i := range want[:passes+1] {
			if order[i] != want[i] {
				t.Fatalf("order of holds %v, want %v: the other Client's waiter gets the lock after %d passes", order, want, passes)
			}
		}
	})
}

// A waiter that gives up while a release passes it the lock has the pass
// undone: the lock is free again, not held by nobody until its TTL.
func TestCohortWaiterGivesUpDuringThePass(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		gate := &unlockGate{sha: lua.Script("mutex_unlock").Hash()}
		c, rdb := hookedClient(t, b, gate)
		rec := &redistest.Recorder{}
		rdb.AddHook(rec)
		a, w := c.Mutex(name), c.Mutex(name)
		must(t, a.Lock(ctx))
		wctx, cancel := context.WithCancel(ctx)
		got := lockAsync(wctx, w)
		waitingInProcess(t, c, name, 1)
		gate.close()
		unlocked := make(chan error, 1)
		go func() { unlocked <- a.Unlock(ctx) }()
		waitFor(t, 10*time.Second, "the pass sent", func() bool { return gate.held.Load() == 1 })
		cancel()
		select {
		case err := <-got:
			mustIs(t, err, context.Canceled, "Lock given up while the pass is under way")
		case <-time.After(10 * time.Second):
			t.Fatal("Lock did not return after its ctx ended")
		}
		gate.open()
		recvNil(t, unlocked, 10*time.Second, "the releaser's Unlock")
		other := newClient(t, b).Mutex(name)
		waitFor(t, 10*time.Second, "the lock free again", func() bool {
			ok, err := other.TryLock(ctx)
			must(t, err)
			return ok
		})
		if _, err := w.Lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
			t.Fatalf("the waiter that gave up has a lease: %v", err)
		}
		must(t, other.Unlock(ctx))
		// The pass delivered again later (a late copy) gives nothing to the
		// call that gave up.
		var pass []any
		for _, args := range rec.All() {
			if len(args) == 20 {
				pass = args
			}
		}
		if pass == nil {
			t.Fatal("no pass recorded")
		}
		r, err := b.NewClient(t).Do(ctx, pass...).Result()
		must(t, err)
		if f := fenceInRedis(t, rdb, name); f != "" {
			t.Fatalf("a late copy of the pass (reply %v) left a hold with token %q", r, f)
		}
	})
}

// A pass whose reply is lost: the waiter asks Redis under the id the pass
// named, and holds the hold the pass gave it (with the token Redis has);
// the releaser's Unlock, retried, ends nothing more.
func TestCohortPassReplyLost(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		f := &redistest.Faults{}
		f.Match(passCmd)
		c, rdb := hookedClient(t, b, f, dsync.FixedLease())
		a, w := c.Mutex(name), c.Mutex(name)
		// The scripts loaded, so that the fault hits the pass itself, not
		// a NOSCRIPT reply before it.
		must(t, a.Lock(ctx))
		must(t, a.Unlock(ctx))
		must(t, a.Lock(ctx))
		got := lockAsync(ctx, w)
		waitingInProcess(t, c, name, 1)
		f.DropReplyNext(1, nil)
		if err := a.Unlock(ctx); err == nil {
			t.Fatal("Unlock whose reply was lost returned nil")
		}
		unlocked := time.Now()
		recvNil(t, got, 10*time.Second, "the waiting Lock after a lost pass reply")
		lw, err := w.Lease(ctx)
		must(t, err)
		// The hold began before the release returned: the waiter's lease,
		// learned from its own attempt, must not outlast its TTL from then.
		if d := dsync.LeaseDeadline(lw); d.After(unlocked.Add(30 * time.Second)) {
			t.Fatalf("hold of a lost pass: lease ends %v after the release returned, later than its TTL (30s)", d.Sub(unlocked))
		}
		if f := fenceInRedis(t, rdb, name); f != strconv.FormatUint(lw.Token(), 10) {
			t.Fatalf("Redis holds token %q, the waiter believes %d", f, lw.Token())
		}
		must(t, a.Unlock(ctx)) // the retry finds its release done
		if f := fenceInRedis(t, rdb, name); f != strconv.FormatUint(lw.Token(), 10) {
			t.Fatalf("after the releaser's retried Unlock Redis holds token %q, want the waiter's %d", f, lw.Token())
		}
		must(t, w.Unlock(ctx))
		if f := fenceInRedis(t, rdb, name); f != "" {
			t.Fatalf("held (token %q) after every Unlock", f)
		}
		if n := f.Injected(); n != 1 {
			t.Fatalf("%d replies dropped, want 1", n)
		}
	})
}

// A waiter in the process whose ctx ends leaves at once; the next release
// passes to nobody, and nothing stays behind.
func TestCohortWaiterCancelled(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		a, w := c.Mutex(name), c.Mutex(name)
		must(t, a.Lock(ctx))
		wctx, cancel := context.WithCancel(ctx)
		got := lockAsync(wctx, w)
		waitingInProcess(t, c, name, 1)
		cancel()
		select {
		case err := <-got:
			mustIs(t, err, context.Canceled, "Lock waiting in the process")
		case <-time.After(10 * time.Second):
			t.Fatal("Lock did not return after its ctx ended")
		}
		waitingInProcess(t, c, name, 0)
		must(t, a.Unlock(ctx))
		if n := dsync.CohortMembers(c, mutexKeys(name).Lock); n != 0 {
			t.Fatalf("%d cohort members after every call ended", n)
		}
		other := newClient(t, b).Mutex(name)
		if ok, err := other.TryLock(ctx); err != nil || !ok {
			t.Fatalf("TryLock after the holder's Unlock: %v, %v", ok, err)
		}
		must(t, other.Unlock(ctx))
	})
}

func TestCohortWaiterClientClosed(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		must(t, c.Mutex(name).Lock(ctx))
		got := lockAsync(ctx, c.Mutex(name))
		waitingInProcess(t, c, name, 1)
		must(t, c.Close())
		select {
		case err := <-got:
			mustIs(t, err, dsync.ErrClosed, "Lock waiting in the process when the Client closed")
		case <-time.After(10 * time.Second):
			t.Fatal("Lock did not return after Close")
		}
	})
}

// A holder whose hold is gone from Redis without an Unlock (expired, or
// removed) keeps no waiter of its process from the lock for long: a call
// waits in the process for half its TTL at most, then asks Redis.
func TestCohortWaiterGoesToRedisWhenTheHolderDoesNotUnlock(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b, dsync.TTL(2*time.Second))
		rdb := b.NewClient(t)
		must(t, c.Mutex(name).Lock(ctx))
		w := c.Mutex(name)
		got := lockAsync(ctx, w)
		waitingInProcess(t, c, name, 1)
		must(t, rdb.Del(ctx, mutexKeys(name).Lock).Err()) // the hold is gone
		recvNil(t, got, 20*time.Second, "the waiter, its holder gone without an Unlock")
		lw, err := w.Lease(ctx)
		must(t, err)
		if f := fenceInRedis(t, rdb, name); f != strconv.FormatUint(lw.Token(), 10) {
			t.Fatalf("Redis holds token %q, the waiter believes %d", f, lw.Token())
		}
		must(t, w.Unlock(ctx))
	})
}

// A member whose hold is found lost (here: removed from Redis, found gone
// by a renewal) ends its membership then: the call waiting in the process
// tries in Redis at once, not after half its TTL (30 s here), and the
// lost holder's Unlock reports the loss and leaves the new hold alone.
func TestCohortHolderLeaseLostEndsTheWait(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b, dsync.TTL(time.Minute), dsync.RenewEvery(100*time.Millisecond))
		rdb := b.NewClient(t)
		holder := c.Mutex(name)
		must(t, holder.Lock(ctx))
		lh, err := holder.Lease(ctx)
		must(t, err)
		w := c.Mutex(name)
		got := lockAsync(ctx, w)
		waitingInProcess(t, c, name, 1)
		must(t, rdb.Del(ctx, mutexKeys(name).Lock).Err()) // the hold is gone
		recvNil(t, got, 15*time.Second, "the waiter, its holder's lease lost")
		select {
		case <-lh.Done():
		default:
			t.Fatal("the waiter got in while the lost holder's lease was not done")
		}
		mustIs(t, lh.Err(), dsync.ErrLeaseLost, "the lost holder's Lease.Err")
		lw, err := w.Lease(ctx)
		must(t, err)
		mustIs(t, holder.Unlock(ctx), dsync.ErrLeaseLost, "the lost holder's Unlock")
		if f := fenceInRedis(t, rdb, name); f != strconv.FormatUint(lw.Token(), 10) {
			t.Fatalf("after the lost holder's Unlock Redis holds token %q, the waiter %d", f, lw.Token())
		}
		if lw.Token() <= lh.Token() {
			t.Fatalf("the waiter's token %d is not above the lost holder's %d", lw.Token(), lh.Token())
		}
		must(t, w.Unlock(ctx))
		if n := dsync.CohortMembers(c, mutexKeys(name).Lock); n != 0 {
			t.Fatalf("%d cohort members after every hold ended, want 0", n)
		}
	})
}

// Many calls of two Clients: never two holders, and every hold's token,
// as Redis has it while the hold lives, is larger than the last.
func TestCohortExclusionAndTokens(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		const perClient, rounds = 4, 25
		rdb := b.NewClient(t)
		var (
			inside atomic.Int32
			mu     sync.Mutex
			last   uint64
			errs   = make(chan error, 2*perClient)
		)
		for range 2 {
			c := newClient(t, b)
			for range perClient {
				go func() {
					m := c.Mutex(name)
					for range rounds {
						if err := m.Lock(ctx); err != nil {
							errs <- err
							return
						}
						if n := inside.Add(1); n != 1 {
							errs <- errors.New("two holders at once")
							return
						}
						l, err := m.Lease(ctx)
						if err != nil {
							errs <- err
							return
						}
						f, err := rdb.HGet(ctx, mutexKeys(name).Lock, ":f").Result()
						if err != nil || f != strconv.FormatUint(l.Token(), 10) {
							errs <- errors.New("Redis holds token " + f + ", the holder believes " + strconv.FormatUint(l.Token(), 10))
							return
						}
						mu.Lock()
						if l.Token() <= last {
							mu.Unlock()
							errs <- errors.New("token did not rise")
							return
						}
						last = l.Token()
						mu.Unlock()
						inside.Add(-1)
						if err := m.Unlock(ctx); err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
			}
		}
		for range 2 * perClient {
			select {
			case err := <-errs:
				must(t, err)
			case <-ctx.Done():
				t.Fatal("timed out")
			}
		}
	})
}

// A release that fails (and is not tried again) still ends its call's
// membership: the Client's later Lock calls on the name do not wait in the
// process for a release that will not come, but ask Redis at once.
func TestCohortFailedReleaseEndsTheMembership(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		sha := lua.Script("mutex_unlock").Hash()
		f := &redistest.Faults{}
		f.Match(func(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" && cmd.Args()[1] == sha })
		c, rdb := hookedClient(t, b, f)
		a := c.Mutex(name)
		must(t, a.Lock(ctx))
		f.FailNext(1, nil)
		if err := a.Unlock(ctx); err == nil {
			t.Fatal("Unlock that could not be sent returned nil")
		}
		if n := dsync.CohortMembers(c, mutexKeys(name).Lock); n != 0 {
			t.Fatalf("%d cohort members after the only member's release failed, want 0", n)
		}
		must(t, rdb.Del(ctx, mutexKeys(name).Lock).Err()) // the hold expired
		// With the default TTL (30 s), a call that waited in the process
		// would ask Redis only after 15 s.
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		w := c.Mutex(name)
		must(t, w.Lock(lctx))
		must(t, w.Unlock(ctx))
	})
}
