package dsync_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// Client reentrancy with one owner in several goroutines of a process,
// while the owner's hold is being released or a call of it fails: a
// goroutine whose Lock returns nil holds the lock in Redis (another owner
// cannot take it), and its Unlock returns nil. Each test holds script calls
// back at a gate until the interleaving it needs has happened; none
// depends on timing.

// gateKey carries a *gate in the ctx of the calls it holds back.
type gateKey struct{}

// A gate holds back the calls of one script made under a ctx that carries
// it, before they are sent or (after) once the server answered, until open
// is closed. With fail, a call held after its answer gets an error
// instead, as if the reply had been lost.
type gate struct {
	sha     string
	after   bool
	fail    bool
	arrived chan struct{}
	open    chan struct{}
}

func newGate(t *testing.T, script string, after bool) *gate {
	t.Helper()
	src, err := dsync.ScriptSource(script)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum([]byte(src))
	return &gate{sha: hex.EncodeToString(sum[:]), after: after, arrived: make(chan struct{}, 64), open: make(chan struct{})}
}

func (g *gate) on(ctx context.Context) context.Context { return context.WithValue(ctx, gateKey{}, g) }

// await waits until n calls have arrived at the gate.
func (g *gate) await(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-g.arrived:
		case <-time.After(30 * time.Second):
			t.Fatal("no call arrived at the gate")
		}
	}
}

// run runs call with ctx in a goroutine and waits until n of its calls
// have arrived at g; the channel returned gets call's error.
func (g *gate) run(t *testing.T, n int, ctx context.Context, call func(context.Context) error) <-chan error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- call(ctx) }()
	g.await(t, n)
	return errc
}

func (g *gate) matches(cmd redis.Cmder) bool {
	a := cmd.Args()
	return len(a) > 1 && a[0] == "evalsha" && a[1] == g.sha
}

func (g *gate) pass() {
	select {
	case g.arrived <- struct{}{}:
	default:
	}
	<-g.open
}

// gateHook applies the gate in a command's ctx, if any.
type gateHook struct{}

func (gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g, _ := ctx.Value(gateKey{}).(*gate)
		if g == nil || !g.matches(cmd) {
			return next(ctx, cmd)
		}
		if !g.after {
			g.pass()
			return next(ctx, cmd)
		}
		err := next(ctx, cmd)
		g.pass()
		if g.fail {
			cmd.SetErr(context.Canceled)
			return context.Canceled
		}
		return err
	}
}

// A reEnv is a Client or a Quorum whose Redis clients apply gates.
type reEnv struct {
	name     string
	members  int // masters a call goes to
	mk       reMaker
	shared   interface{} // for SetReleaseWaitHook
	cleanups func()      // waits for the clean-ups left to the background
}

type reMaker interface {
	Mutex(name string, opts ...dsync.Option) *dsync.Mutex
	RWMutex(name string, opts ...dsync.Option) *dsync.RWMutex
}

// reEnvs returns a Client on b and a Quorum of three masters of b's kind.
func reEnvs(t *testing.T, b redistest.Backend) []reEnv {
	rdb := b.NewClient(t)
	rdb.AddHook(gateHook{})
	c := dsync.New(rdb)
	t.Cleanup(func() { c.Close() })
	var rdbs []redis.UniversalClient
	if b.Mini != nil {
		for range 3 {
			rdbs = append(rdbs, redistest.Miniredis(t).NewClient(t))
		}
	} else {
		_, rdbs = masters(t, 3)
	}
	for _, r := range rdbs {
		r.AddHook(gateHook{})
	}
	q := newQuorum(t, rdbs)
	return []reEnv{
		{name: "client", members: 1, mk: c, shared: c, cleanups: func() { dsync.WaitCleanups(c) }},
		{name: "quorum", members: 3, mk: q, shared: q, cleanups: func() {}},
	}
}

// A rePrim is one kind of hold: the owner's lock and unlock, and another
// owner's try of a conflicting hold.
type rePrim struct {
	name                 string
	lockScript, unScript string
	lock, unlock         func(ctx context.Context) error
	otherTry             func(ctx context.Context) (bool, error)
	otherUnlock          func(ctx context.Context) error
}

func rePrims(mk reMaker, name string) []rePrim {
	m := mk.Mutex(name, dsync.ClientReentrancy())
	rw := mk.RWMutex(name, dsync.ClientReentrancy())
	return []rePrim{
		{"Mutex", "mutex_lock", "mutex_unlock", m.Lock, m.Unlock, m.TryLock, m.Unlock},
		{"RWMutex write", "rwmutex_lock", "rwmutex_unlock", rw.Lock, rw.Unlock, rw.TryLock, rw.Unlock},
		{"RWMutex read", "rwmutex_lock", "rwmutex_unlock", rw.RLock, rw.RUnlock, rw.TryLock, rw.Unlock},
	}
}

// eachRe runs f for every kind of hold, in a Client and in a Quorum, on
// miniredis and on a real server.
func eachRe(t *testing.T, f func(t *testing.T, e reEnv, p rePrim)) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			for _, e := range reEnvs(t, b) {
				t.Run(e.name, func(t *testing.T) {
					for _, p := range rePrims(e.mk, redistest.Key(t)) {
						t.Run(p.name, func(t *testing.T) {
							ctx := ctxT(t)
							// Warm up: the scripts are loaded, so that no
							// NOSCRIPT round trip passes a gate twice.
							other := dsync.WithOwner(ctx)
							must(t, p.lock(other))
							must(t, p.unlock(other))
							f(t, e, p)
						})
					}
				})
			}
		})
	}
}

// judge checks, from Redis, that own holds p: another owner cannot take
// it, own's Unlock returns nil, and then the other owner can.
func judge(t *testing.T, p rePrim, own context.Context) {
	t.Helper()
	other := dsync.WithOwner(ctxT(t))
	if ok, err := p.otherTry(other); err != nil || ok {
		t.Errorf("another owner's try while the owner holds = %v, %v; want false, nil", ok, err)
		if ok {
			_ = p.otherUnlock(other)
		}
	}
	if err := p.unlock(own); err != nil {
		t.Errorf("the owner's unlock = %v; want nil", err)
	}
	if ok, err := p.otherTry(other); err != nil || !ok {
		t.Errorf("another owner's try after the owner's unlock = %v, %v; want true, nil", ok, err)
	} else if err := p.otherUnlock(other); err != nil {
		t.Error(err)
	}
}

// A Lock by one goroutine of an owner while another goroutine's last
// Unlock of the owner's hold is in flight waits for that release, and then
// takes the lock afresh: it does not re-enter the hold being released.
func TestClientReentrancyLockDuringLastUnlock(t *testing.T) {
	eachRe(t, func(t *testing.T, e reEnv, p rePrim) {
		own := dsync.WithOwner(ctxT(t))
		must(t, p.lock(own))
		g := newGate(t, p.unScript, false)
		unlocked := g.run(t, 1, g.on(own), p.unlock)

		waiting := make(chan struct{}, 1)
		dsync.SetReleaseWaitHook(e.shared, func() {
			select {
			case waiting <- struct{}{}:
			default:
			}
		})
		t.Cleanup(func() { dsync.SetReleaseWaitHook(e.shared, nil) })
		locked := make(chan error, 1)
		go func() { locked <- p.lock(own) }()
		select {
		case err := <-locked:
			// Returned while the release was held back: it re-entered
			// the hold being released.
			close(g.open)
			if err := <-unlocked; err != nil {
				t.Fatalf("the first goroutine's unlock = %v", err)
			}
			if err == nil {
				judge(t, p, own)
			}
			t.Fatalf("Lock returned %v while the owner's last unlock was in flight; want it to wait", err)
		case <-waiting:
		}
		close(g.open)
		if err := <-unlocked; err != nil {
			t.Fatalf("the first goroutine's unlock = %v", err)
		}
		if err := <-locked; err != nil {
			t.Fatalf("Lock after the release = %v", err)
		}
		judge(t, p, own)
	})
}

// A Lock by one goroutine of an owner that went to Redis before another
// goroutine recorded the owner's hold, and was granted it there as a
// re-entry, does not count on that grant if the other goroutine's last
// Unlock ended the hold meanwhile: it takes the lock again.
func TestClientReentrancyGrantOfHoldReleasedMeanwhile(t *testing.T) {
	eachRe(t, func(t *testing.T, e reEnv, p rePrim) {
		own := dsync.WithOwner(ctxT(t))
		ga := newGate(t, p.lockScript, true)
		aLocked := ga.run(t, e.members, ga.on(own), p.lock) // taken in Redis, not yet recorded

		gb := newGate(t, p.lockScript, true)
		bLocked := gb.run(t, e.members, gb.on(own), p.lock) // a re-entry in Redis, not yet recorded

		close(ga.open)
		if err := <-aLocked; err != nil {
			t.Fatalf("the first goroutine's lock = %v", err)
		}
		if err := p.unlock(own); err != nil {
			t.Fatalf("the first goroutine's unlock = %v", err)
		}
		close(gb.open)
		if err := <-bLocked; err != nil {
			t.Fatalf("the second goroutine's lock = %v", err)
		}
		judge(t, p, own)
	})
}

// A lock call of an owner whose reply was lost (its ctx cancelled) is
// abandoned; if another goroutine of the owner re-entered the hold in
// Redis meanwhile and counts on it, the abandon leaves the hold alone.
func TestClientReentrancyAbandonKeepsReentry(t *testing.T) {
	eachRe(t, func(t *testing.T, e reEnv, p rePrim) {
		own := dsync.WithOwner(ctxT(t))
		g := newGate(t, p.lockScript, true)
		g.fail = true
		actx, cancel := context.WithCancel(g.on(own))
		defer cancel()
		aLocked := g.run(t, e.members, actx, p.lock) // taken in Redis; the reply will be lost

		if err := p.lock(own); err != nil {
			t.Fatalf("the second goroutine's lock = %v", err)
		}
		cancel()
		close(g.open)
		if err := <-aLocked; err == nil {
			t.Fatal("the first goroutine's lock returned nil after its reply was lost")
		} else if !errors.Is(err, context.Canceled) && !errors.Is(err, dsync.ErrNoQuorum) {
			t.Logf("the first goroutine's lock: %v", err)
		}
		e.cleanups()
		judge(t, p, own)
	})
}

// Under client reentrancy an owner's other goroutines re-enter its hold
// without asking Redis, so the last Unlock must learn whether it ended the
// hold: a release whose reply is lost is sent again under its call id
// until a reply says (Unlock then returns its outcome), and if none comes
// the hold is reported lost and the owner's next Lock asks Redis instead
// of re-entering a hold that may be gone.
func TestClientReentrancyLastUnlockWithLostReplies(t *testing.T) {
	isScript := func(c redis.Cmder) bool { n := c.Name(); return n == "evalsha" || n == "eval" }
	kinds := []struct {
		name         string
		lock, unlock func(c *dsync.Client, name string) func(ctx context.Context) error
		lease        func(c *dsync.Client, name string) func(ctx context.Context) (*dsync.Lease, error)
	}{
		{"Mutex",
			func(c *dsync.Client, n string) func(context.Context) error { return c.Mutex(n).Lock },
			func(c *dsync.Client, n string) func(context.Context) error { return c.Mutex(n).Unlock },
			func(c *dsync.Client, n string) func(context.Context) (*dsync.Lease, error) { return c.Mutex(n).Lease }},
		{"RWMutex write",
			func(c *dsync.Client, n string) func(context.Context) error { return c.RWMutex(n).Lock },
			func(c *dsync.Client, n string) func(context.Context) error { return c.RWMutex(n).Unlock },
			func(c *dsync.Client, n string) func(context.Context) (*dsync.Lease, error) { return c.RWMutex(n).Lease }},
		{"RWMutex read",
			func(c *dsync.Client, n string) func(context.Context) error { return c.RWMutex(n).RLock },
			func(c *dsync.Client, n string) func(context.Context) error { return c.RWMutex(n).RUnlock },
			func(c *dsync.Client, n string) func(context.Context) (*dsync.Lease, error) {
				return c.RWMutex(n).RLease
			}},
	}
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel() // a release that gets no reply is sent for 5 s
			eachBackend(t, func(t *testing.T, b redistest.Backend) {
				for _, lost := range []struct {
					name  string
					drops int
				}{{"reply lost twice", 2}, {"no reply comes", 1 << 20}} {
					t.Run(lost.name, func(t *testing.T) {
						ctx := dsync.WithOwner(ctxT(t))
						name := redistest.Key(t)
						rdb := b.NewClient(t)
						faults := &redistest.Faults{}
						faults.Match(isScript)
						rdb.AddHook(faults)
						c := dsync.New(rdb, dsync.ClientReentrancy())
						defer c.Close()
						otherW := newClient(t, b).Mutex(name) // for the Mutex
						otherRW := newClient(t, b).RWMutex(name)
						held := func() bool {
							// Is the name held in Redis? Another owner tries.
							if kind.name == "Mutex" {
								ok, err := otherW.TryLock(ctx)
								if err != nil {
									t.Fatal(err)
								}
								if ok {
									_ = otherW.Unlock(ctx)
								}
								return !ok
							}
							ok, err := otherRW.TryLock(ctx)
							if err != nil {
								t.Fatal(err)
							}
							if ok {
								_ = otherRW.Unlock(ctx)
							}
							return !ok
						}
						must(t, kind.lock(c, name)(ctx))
						lease, err := kind.lease(c, name)(ctx)
						if err != nil {
							t.Fatal(err)
						}
						// Every copy of the release runs on the server;
						// its reply is lost.
						faults.DropReplyNext(lost.drops, nil)
						err = kind.unlock(c, name)(ctx)
						faults.DropReplyNext(0, nil)
						if lost.drops < 100 {
							if err != nil {
								t.Fatalf("last Unlock whose reply was lost twice = %v, want nil (its copy sent again learns the outcome)", err)
							}
						} else {
							if err == nil {
								t.Fatal("last Unlock that never got a reply returned nil")
							}
							select {
							case <-lease.Done():
							default:
								t.Fatal("the hold whose release got no reply is still live in the process")
							}
							if !errors.Is(lease.Err(), dsync.ErrLeaseLost) {
								t.Errorf("its lease reports %v, want ErrLeaseLost", lease.Err())
							}
						}
						if held() {
							t.Fatal("the release ran on the server, yet the name is held")
						}
						// The owner locks again: Redis must hold it for the
						// owner now.
						must(t, kind.lock(c, name)(ctx))
						if !held() {
							t.Fatal("the owner's Lock after its last Unlock returned nil, but Redis holds nothing: it re-entered a released hold")
						}
						if err := kind.unlock(c, name)(ctx); err != nil {
							t.Fatalf("Unlock of the new hold: %v", err)
						}
					})
				}
			})
		})
	}
}
