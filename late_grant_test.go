package dsync_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// A call handed a hold while it waited learns of it from its next attempt
// when the hand-over's notification is late. If that hold ended before
// (nobody renewed it: its caller did not know of it yet) and the holder
// took the name afresh meanwhile, through another call, the attempt must
// not report the new hold as the call's: the call's level (permits) is
// not in it, and the holder would believe it holds more than Redis counts.

// firstGate holds back the first attempt of a script sent once it is
// armed, until opened, as a slow network would; other commands pass.
type firstGate struct {
	sha    string
	mu     sync.Mutex
	armed  bool
	caught bool
	passed int // attempts let through and not yet answered
	open   chan struct{}
	done   chan struct{} // closed once the held attempt got its reply
	// unsent: the held attempt fails with context.Canceled once open, as
	// a command does whose ctx ended before it was written (see drop).
	unsent bool
}

// drop lets the held attempt, if any, fail unsent with context.Canceled,
// as its caller's ctx had ended before it was written; later attempts
// pass.
func (g *firstGate) drop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		g.unsent = true
		close(g.open)
	}
}

// dropped reports whether the held attempt is to fail unsent.
func (g *firstGate) dropped() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.unsent
}

func newFirstGate(script string) *firstGate {
	return &firstGate{sha: lua.Script(script).Hash(), open: make(chan struct{}), done: make(chan struct{})}
}

// arm holds back the next attempt from now on, and returns once those
// let through before have been answered: none of them is on its way.
func (g *firstGate) arm(t *testing.T) {
	g.mu.Lock()
	g.armed = true
	g.mu.Unlock()
	waitFor(t, 10*time.Second, "the attempts sent before the gate was armed answered", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.passed == 0
	})
}

// catch reports whether cmd is the attempt to hold back; if not, and it
// is an attempt, it counts it as on its way until answered (see
// answered).
func (g *firstGate) catch(cmd redis.Cmder) (held, attempt bool) {
	a := cmd.Args()
	if cmd.Name() != "evalsha" || len(a) < 2 || a[1] != g.sha {
		return false, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.armed || g.caught {
		g.passed++
		return false, true
	}
	g.caught = true
	return true, true
}

func (g *firstGate) answered(n int) {
	g.mu.Lock()
	g.passed -= n
	g.mu.Unlock()
}

func (g *firstGate) isArmed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.armed
}

func (g *firstGate) holding() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.caught
}

func (g *firstGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *firstGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		held, attempt := g.catch(cmd)
		if held {
			<-g.open
			defer close(g.done)
			if g.dropped() {
				cmd.SetErr(context.Canceled)
				return context.Canceled
			}
		} else if attempt {
			defer g.answered(1)
		}
		return next(ctx, cmd)
	}
}

func (g *firstGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n, hold := 0, false
		for _, c := range cmds {
			held, attempt := g.catch(c)
			hold = hold || held
			if attempt && !held {
				n++
			}
		}
		defer g.answered(n)
		if hold {
			<-g.open
			defer close(g.done)
			if g.dropped() {
				for _, c := range cmds {
					c.SetErr(context.Canceled)
				}
				return context.Canceled
			}
		}
		return next(ctx, cmds)
	}
}

// lateGrantKind is one kind of hold: C's call (which waits), D's (which
// takes the name afresh for the same holder, and must not wait), their
// releases, and another Client's try, which must fail while the holder
// holds what C and D were told they hold.
type lateGrantKind struct {
	name, script string
	waiting      string // C's place (see waitingKey)
	owned        bool
	// calls returns the calls of C and D through a handle of c with opts.
	calls func(c *dsync.Client, name string, opts ...dsync.Option) (c1, d1 func(context.Context) error, c0, d0 func(context.Context) error)
	// full takes the whole name through c, for a lease TTL of ttl.
	full  func(t *testing.T, ctx context.Context, c *dsync.Client, name string) (release func(context.Context) error)
	other func(ctx context.Context, c *dsync.Client, name string) (bool, error)
}

func lateGrantKinds() []lateGrantKind {
	const size = 2 // the Semaphore's: C wants both permits, D one
	mutex := func(c *dsync.Client, n string, opts ...dsync.Option) (func(context.Context) error, func(context.Context) error, func(context.Context) error, func(context.Context) error) {
		m := c.Mutex(n, opts...)
		return m.Lock, m.Lock, m.Unlock, m.Unlock
	}
	write := func(c *dsync.Client, n string, opts ...dsync.Option) (func(context.Context) error, func(context.Context) error, func(context.Context) error, func(context.Context) error) {
		rw := c.RWMutex(n, opts...)
		return rw.Lock, rw.Lock, rw.Unlock, rw.Unlock
	}
	read := func(c *dsync.Client, n string, opts ...dsync.Option) (func(context.Context) error, func(context.Context) error, func(context.Context) error, func(context.Context) error) {
		rw := c.RWMutex(n, opts...)
		return rw.RLock, rw.RLock, rw.RUnlock, rw.RUnlock
	}
	sem := func(c *dsync.Client, n string, opts ...dsync.Option) (func(context.Context) error, func(context.Context) error, func(context.Context) error, func(context.Context) error) {
		s := c.Semaphore(n, size, opts...)
		return func(ctx context.Context) error { return s.Acquire(ctx, size) },
			func(ctx context.Context) error { return s.Acquire(ctx, 1) },
			func(ctx context.Context) error { return s.Release(ctx, size) },
			func(ctx context.Context) error { return s.Release(ctx, 1) }
	}
	// The name taken whole by another Client, with a lease of 3 s, so that
	// C, queued behind it, comes back within 3 s of its release.
	const fullTTL = 3 * time.Second
	mutexFull := func(t *testing.T, ctx context.Context, c *dsync.Client, n string) func(context.Context) error {
		m := c.Mutex(n, dsync.TTL(fullTTL))
		must(t, m.Lock(ctx))
		return m.Unlock
	}
	writeFull := func(t *testing.T, ctx context.Context, c *dsync.Client, n string) func(context.Context) error {
		rw := c.RWMutex(n, dsync.TTL(fullTTL))
		must(t, rw.Lock(ctx))
		return rw.Unlock
	}
	semFull := func(t *testing.T, ctx context.Context, c *dsync.Client, n string) func(context.Context) error {
		s := c.Semaphore(n, size, dsync.TTL(fullTTL))
		must(t, s.Acquire(ctx, size))
		return func(ctx context.Context) error { return s.Release(ctx, size) }
	}
	mutexTry := func(ctx context.Context, c *dsync.Client, n string) (bool, error) { return c.Mutex(n).TryLock(ctx) }
	writeTry := func(ctx context.Context, c *dsync.Client, n string) (bool, error) { return c.RWMutex(n).TryLock(ctx) }
	semTry := func(ctx context.Context, c *dsync.Client, n string) (bool, error) {
		return c.Semaphore(n, size).TryAcquire(ctx, 1)
	}
	return []lateGrantKind{
		{"Mutex", "mutex_lock", "mutex", true, mutex, mutexFull, mutexTry},
		{"RWMutex-write", "rwmutex_lock", "write", true, write, writeFull, writeTry},
		{"RWMutex-read", "rwmutex_lock", "read", true, read, writeFull, writeTry},
		{"Semaphore-owner", "semaphore_acquire", "sem", true, sem, semFull, semTry},
		{"Semaphore-handle", "semaphore_acquire", "sem", false, sem, semFull, semTry},
	}
}

// C waits behind another Client's hold; its notifications are held back
// and its next attempt is held by the network. The release hands the name
// to C; that hold ends unrenewed; D, of the same holder, takes the name
// afresh; C's attempt then arrives. C must not be told D's hold is its
// own: once D gives back what it took, C holds what it was told it holds,
// and another Client finds no room.
func TestLateGrantOfAnEndedHoldIsNotTheHoldersNext(t *testing.T) {
	for _, k := range lateGrantKinds() {
		t.Run(k.name, func(t *testing.T) {
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				const ttl = 600 * time.Millisecond // C's: its hand-over ends unrenewed
				gate := newFirstGate(k.script)
				c, rdb := hookedClient(t, b, gate)
				// The hand-overs published to c, held back once the gate is
				// armed ("<call id> <holder digest> <fencing token>
				// <proof>"). Other messages pass: a held message holds up
				// those after it, subscription replies included, and C
				// may still be subscribing.
				held := make(chan struct{})
				dsync.SetMessageHook(c, func(_, payload string) {
					if f := strings.Fields(payload); gate.isArmed() && len(f) == 4 && f[2] != "0" {
						<-held
					}
				})
				var heldOnce sync.Once
				release := func() { heldOnce.Do(func() { close(held) }) }
				t.Cleanup(release)
				t.Cleanup(func() {
					select {
					case <-gate.open:
					default:
						close(gate.open)
					}
				})
				hctx := ctx // the holder's calls
				if k.owned {
					hctx = dsync.WithOwner(ctx)
				}
				cTake, dTake, cRelease, dRelease := k.calls(c, name, dsync.TTL(ttl))
				// Load the scripts first: a NOSCRIPT fallback would pass the
				// gate.
				must(t, dTake(hctx))
				must(t, dRelease(hctx))
				other := newClient(t, b)
				freeFull := k.full(t, ctx, other, name)
				cIn := async(func() error { return cTake(hctx) })
				waitFor(t, 10*time.Second, "C queued", func() bool {
					n, err := rdb.Exists(ctx, waitingKey(k.waiting, name)).Result()
					return err == nil && n == 1
				})
				gate.arm(t)
				must(t, freeFull(ctx)) // hands the name to C, which does not know yet
				waitFor(t, 10*time.Second, "C's next attempt, held by the network", gate.holding)
				b.Advance(ttl + 400*time.Millisecond) // C's hold ends, renewed by nobody
				must(t, dTake(hctx))                  // D takes the name afresh for the holder
				close(gate.open)
				select {
				case <-gate.done:
				case <-time.After(10 * time.Second):
					t.Fatal("C's held attempt got no reply")
				}
				// C was told what its attempt found; D gives back what it
				// took, and C then holds (or goes on to take) its own.
				must(t, dRelease(hctx))
				release()
				select {
				case err := <-cIn:
					must(t, err)
				case <-time.After(10 * time.Second):
					t.Fatal("C did not get the name after D's release")
				}
				// Redis-side: the holder holds what C was told it holds.
				ok, err := k.other(ctx, newClient(t, b), name)
				must(t, err)
				if ok {
					t.Fatal("another Client took the name while C holds it: C was told it holds what Redis does not count")
				}
				must(t, cRelease(hctx))
			})
		})
	}
}
