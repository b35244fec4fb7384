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
// own script. The tests here run on each lock that has cohorts (a Mutex,
// and an RWMutex's write lock: see cohort_rwmutex_test.go for what is the
// RWMutex's own), and judge by what Redis holds.

// A cohortKind is a lock whose Lock calls without an owner go through the
// Client's cohorts.
type cohortKind struct {
	name   string
	handle func(c *dsync.Client, name string) cohortHandle
	// key is the lock's hash, whose ':f' is the hold's fencing token; the
	// cohort's key too. queue is where other processes' waiters queue.
	key, queue func(name string) string
	// The lock and unlock scripts, and the number of arguments (EVALSHA
	// and the SHA included) of an unlock that passes the lock.
	lock, unlock string
	passArgs     int
}

// cohortHandle is what the tests use of a Mutex or of an RWMutex's write
// lock.
type cohortHandle interface {
	Lock(context.Context) error
	TryLock(context.Context) (bool, error)
	Unlock(context.Context) error
	Lease(context.Context) (*dsync.Lease, error)
}

var cohortKinds = []cohortKind{
	{
		name:   "Mutex",
		handle: func(c *dsync.Client, name string) cohortHandle { return c.Mutex(name) },
		key:    func(name string) string { return mutexKeys(name).Lock },
		queue:  func(name string) string { return mutexKeys(name).Queue },
		lock:   "mutex_lock", unlock: "mutex_unlock", passArgs: 20,
	},
	{
		name:   "RWMutex",
		handle: func(c *dsync.Client, name string) cohortHandle { return c.RWMutex(name) },
		key:    func(name string) string { return rwKeys(name).Writer },
		queue:  func(name string) string { return rwKeys(name).WriterQueue },
		lock:   "rwmutex_lock", unlock: "rwmutex_unlock", passArgs: 25,
	},
}

// eachCohort runs f for each cohortKind, on each backend, with a name of
// its own (see eachName).
func eachCohort(t *testing.T, f func(t *testing.T, k cohortKind, b redistest.Backend, ctx context.Context, name string)) {
	for _, k := range cohortKinds {
		t.Run(k.name, func(t *testing.T) {
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				f(t, k, b, ctx, name)
			})
		})
	}
}

// passCmd reports whether cmd is a release that passes the lock: the
// unlock script of a cohortKind with the pass arguments.
func passCmd(cmd redis.Cmder) bool {
	args := cmd.Args()
	if cmd.Name() != "evalsha" || len(args) < 2 {
		return false
	}
	sha, _ := args[1].(string)
	for _, k := range cohortKinds {
		if len(args) == k.passArgs && sha == lua.Script(k.unlock).Hash() {
			return true
		}
	}
	return false
}

// fence returns the fencing token of name's current hold as Redis has it,
// "" when there is none.
func (k cohortKind) fence(t *testing.T, rdb redis.UniversalClient, name string) string {
	t.Helper()
	f, err := rdb.HGet(context.Background(), k.key(name), ":f").Result()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return f
}

// waiting waits until n Lock calls of c wait in the process for name.
func (k cohortKind) waiting(t *testing.T, c *dsync.Client, name string, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, strconv.Itoa(n)+" calls waiting in the process", func() bool {
		return dsync.CohortWaiting(c, k.key(name)) == n
	})
}

// members fails t unless c's cohort of name has n members.
func (k cohortKind) members(t *testing.T, c *dsync.Client, name string, n int, what string) {
	t.Helper()
	if got := dsync.CohortMembers(c, k.key(name)); got != n {
		t.Fatalf("%d cohort members %s, want %d", got, what, n)
	}
}

// lockAsync starts h.Lock(ctx) and returns the channel of its result.
func lockAsync(ctx context.Context, h cohortHandle) <-chan error {
	return async(func() error { return h.Lock(ctx) })
}

func TestCohortReleasePassesTheLock(t *testing.T) {
	eachCohort(t, func(t *testing.T, k cohortKind, b redistest.Backend, ctx context.Context, name string) {
		rec := &redistest.Recorder{}
		c, rdb := hookedClient(t, b, rec, dsync.FixedLease())
		a, w := k.handle(c, name), k.handle(c, name)
		la := lockLease(t, ctx, a)
		got := lockAsync(ctx, w)
		k.waiting(t, c, name, 1)
		rec.Reset()
		must(t, a.Unlock(ctx))
		unlocked := time.Now()
		recvNil(t, got, 10*time.Second, "the waiting Lock")
		// The release's reply gave the hold: the waiter sent no attempt.
		lockSHA, passes := lua.Script(k.lock).Hash(), 0
		for _, args := range rec.All() {
			if args[1] == lockSHA {
				t.Fatalf("the waiter sent a lock attempt: %v", args)
			}
			if len(args) == k.passArgs {
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
		if f := k.fence(t, rdb, name); f != strconv.FormatUint(lw.Token(), 10) {
			t.Fatalf("Redis holds the hold with token %q, the waiter believes %d", f, lw.Token())
		}
		// Redis started the hold's TTL before the release's reply came
		// back: the lease must not outlast that.
		if d := dsync.LeaseDeadline(lw); d.After(unlocked.Add(30 * time.Second)) {
			t.Fatalf("passed hold's lease ends %v after the release returned, later than its TTL (30s)", d.Sub(unlocked))
		}
		// Another Client finds it held, then free once the waiter unlocks.
		other := k.handle(newClient(t, b), name)
		if ok, err := other.TryLock(ctx); err != nil || ok {
			t.Fatalf("TryLock by another Client while the pass's hold lives: %v, %v", ok, err)
		}
		must(t, w.Unlock(ctx))
		if ok, err := other.TryLock(ctx); err != nil || !ok {
			t.Fatalf("TryLock after the passed hold's Unlock: %v, %v", ok, err)
		}
		must(t, other.Unlock(ctx))
		k.members(t, c, name, 0, "after every hold ended")
	})
}

// While others are queued in Redis, a release passes the lock in the
// process at most cohortPasses (8) times in a row.
func TestCohortPassesAreBounded(t *testing.T) {
	eachCohort(t, func(t *testing.T, k cohortKind, b redistest.Backend, ctx context.Context, name string) {
		const passes, local = 8, 10
		c := newClient(t, b)
		first := k.handle(c, name)
		must(t, first.Lock(ctx))
		var (
			mu    sync.Mutex
			order []string
		)
		hold := func(h cohortHandle, who string) <-chan error {
			return async(func() error {
				if err := h.Lock(ctx); err != nil {
					return err
				}
				mu.Lock()
				order = append(order, who)
				mu.Unlock()
				return h.Unlock(ctx)
			})
		}
		var dones []<-chan error
		for i := range local {
			dones = append(dones, hold(k.handle(c, name), "local"+strconv.Itoa(i)))
			k.waiting(t, c, name, i+1)
		}
		// Another process queues in Redis.
		rdb := b.NewClient(t)
		dones = append(dones, hold(k.handle(newClient(t, b), name), "other"))
		waitFor(t, 10*time.Second, "the other Client's queue place", func() bool {
			n, err := rdb.ZCard(ctx, k.queue(name)).Result()
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
	eachCohort(t, func(t *testing.T, k cohortKind, b redistest.Backend, ctx context.Context, name string) {
		gate := &unlockGate{sha: lua.Script(k.unlock).Hash()}
		c, rdb := hookedClient(t, b, gate)
		rec := &redistest.Recorder{}
		rdb.AddHook(rec)
		a, w := k.handle(c, name), k.handle(c, name)
		must(t, a.Lock(ctx))
		wctx, cancel := context.WithCancel(ctx)
		got := lockAsync(wctx, w)
		k.waiting(t, c, name, 1)
		gate.close()
		unlocked := async(func() error { return a.Unlock(ctx) })
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
		other := k.handle(newClient(t, b), name)
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
			if len(args) == k.passArgs {
				pass = args
			}
		}
		if pass == nil {
			t.Fatal("no pass recorded")
		}
		r, err := b.NewClient(t).Do(ctx, pass...).Result()
		must(t, err)
		if f := k.fence(t, rdb, name); f != "" {
			t.Fatalf("a late copy of the pass (reply %v) left a hold with token %q", r, f)
		}
	})
}

// A pass whose reply is lost: the waiter asks Redis under the id the pass
// named, and holds the hold the pass gave it (with the token Redis has);
// the releaser's Unlock, retried, ends nothing more.
func TestCohortPassReplyLost(t *testing.T) {
	eachCohort(t, func(t *testing.T, k cohortKind, b redistest.Backend, ctx context.Context, name string) {
		f := &redistest.Faults{}
		f.Match(passCmd)
		c, rdb := hookedClient(t, b, f, dsync.FixedLease())
		a, w := k.handle(c, name), k.handle(c, name)
		// The scripts loaded, so that the fault hits the pass itself, not
		// a NOSCRIPT reply before it.
		must(t, a.Lock(ctx))
		must(t, a.Unlock(ctx))
		must(t, a.Lock(ctx))
		got := lockAsync(ctx, w)
		k.waiting(t, c, name, 1)
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
		if f := k.fence(t, rdb, name); f != strconv.FormatUint(lw.Token(), 10) {
			t.Fatalf("Redis holds token %q, the waiter believes %d", f, lw.Token())
		}
		must(t, a.Unlock(ctx)) // the retry finds its release done
		if f := k.fence(t, rdb, name); f != strconv.FormatUint(lw.Token(), 10) {
			t.Fatalf("after the releaser's retried Unlock Redis holds token %q, want the waiter's %d", f, lw.Token())
		}
		must(t, w.Unlock(ctx))
		if f := k.fence(t, rdb, name); f != "" {
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
	eachCohort(t, func(t *testing.T, k cohortKind, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		a, w := k.handle(c, name), k.handle(c, name)
		must(t, a.Lock(ctx))
		wctx, cancel := context.WithCancel(ctx)
		got := lockAsync(wctx, w)
		k.waiting(t, c, name, 1)
		cancel()
		select {
		case err := <-got:
			mustIs(t, err, context.Canceled, "Lock waiting in the process")
		case <-time.After(10 * time.Second):
			t.Fatal("Lock did not return after its ctx ended")
		}
		k.waiting(t, c, name, 0)
		must(t, a.Unlock(ctx))
		k.members(t, c, name, 0, "after every call ended")
		other := k.handle(newClient(t, b), name)
		if ok, err := other.TryLock(ctx); err != nil || !ok {
			t.Fatalf("TryLock after the holder's Unlock: %v, %v", ok, err)
		}
		must(t, other.Unlock(ctx))
	})
}

func TestCohortWaiterClientClosed(t *testing.T) {
	eachCohort(t, func(t *testing.T, k cohortKind, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b)
		must(t, k.handle(c, name).Lock(ctx))
		got := lockAsync(ctx, k.handle(c, name))
		k.waiting(t, c, name, 1)
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
	eachCohort(t, func(t *testing.T, k cohortKind, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b, dsync.TTL(2*time.Second))
		rdb := b.NewClient(t)
		must(t, k.handle(c, name).Lock(ctx))
		w := k.handle(c, name)
		got := lockAsync(ctx, w)
		k.waiting(t, c, name, 1)
		must(t, rdb.Del(ctx, k.key(name)).Err()) // the hold is gone
		recvNil(t, got, 20*time.Second, "the waiter, its holder gone without an Unlock")
		lw, err := w.Lease(ctx)
		must(t, err)
		if f := k.fence(t, rdb, name); f != strconv.FormatUint(lw.Token(), 10) {
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
	eachCohort(t, func(t *testing.T, k cohortKind, b redistest.Backend, ctx context.Context, name string) {
		c := newClient(t, b, dsync.TTL(time.Minute), dsync.RenewEvery(100*time.Millisecond))
		rdb := b.NewClient(t)
		holder := k.handle(c, name)
		must(t, holder.Lock(ctx))
		lh, err := holder.Lease(ctx)
		must(t, err)
		w := k.handle(c, name)
		got := lockAsync(ctx, w)
		k.waiting(t, c, name, 1)
		must(t, rdb.Del(ctx, k.key(name)).Err()) // the hold is gone
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
		if f := k.fence(t, rdb, name); f != strconv.FormatUint(lw.Token(), 10) {
			t.Fatalf("after the lost holder's Unlock Redis holds token %q, the waiter %d", f, lw.Token())
		}
		if lw.Token() <= lh.Token() {
			t.Fatalf("the waiter's token %d is not above the lost holder's %d", lw.Token(), lh.Token())
		}
		must(t, w.Unlock(ctx))
		k.members(t, c, name, 0, "after every hold ended")
	})
}

// Many calls of two Clients: never two holders, and every hold's token,
// as Redis has it while the hold lives, is larger than the last.
func TestCohortExclusionAndTokens(t *testing.T) {
	eachCohort(t, func(t *testing.T, k cohortKind, b redistest.Backend, ctx context.Context, name string) {
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
					h := k.handle(c, name)
					for range rounds {
						if err := h.Lock(ctx); err != nil {
							errs <- err
							return
						}
						if n := inside.Add(1); n != 1 {
							errs <- errors.New("two holders at once")
							return
						}
						l, err := h.Lease(ctx)
						if err != nil {
							errs <- err
							return
						}
						f, err := rdb.HGet(ctx, k.key(name), ":f").Result()
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
						if err := h.Unlock(ctx); err != nil {
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
	eachCohort(t, func(t *testing.T, k cohortKind, b redistest.Backend, ctx context.Context, name string) {
		sha := lua.Script(k.unlock).Hash()
		f := &redistest.Faults{}
		f.Match(func(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" && cmd.Args()[1] == sha })
		c, rdb := hookedClient(t, b, f)
		a := k.handle(c, name)
		must(t, a.Lock(ctx))
		f.FailNext(1, nil)
		if err := a.Unlock(ctx); err == nil {
			t.Fatal("Unlock that could not be sent returned nil")
		}
		k.members(t, c, name, 0, "after the only member's release failed")
		must(t, rdb.Del(ctx, k.key(name)).Err()) // the hold expired
		// With the default TTL (30 s), a call that waited in the process
		// would ask Redis only after 15 s.
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		w := k.handle(c, name)
		must(t, w.Lock(lctx))
		must(t, w.Unlock(ctx))
	})
}
