package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/lua"
)

// An owner's Lock waits (readers hold); another goroutine of the owner
// then RLocks (its own waiting place does not hold it back), so the
// waiting Lock is now an upgrade: ErrUpgrade, and its waiting place goes.
// Both must happen at once: a reader of another process that waited only
// because of that place must go on, as when a writer gives up, not when
// the Lock happens to try again (its refusal runs to the readers' lease
// deadline or half its TTL) or its place lapses (a TTL later).
func TestRWMutexUpgradeRefusalWakesReaders(t *testing.T) {
	for _, mode := range reentrancyModes {
		t.Run(mode.name, func(t *testing.T) { testUpgradeRefusalWakesReaders(t, mode.opts...) })
	}
}

func testUpgradeRefusalWakesReaders(t *testing.T, opts ...dsync.Option) {
	b, ctx, name := realName(t)
	rdb := b.NewClient(t)
	// R1 reads (TTL 30 s): nothing makes the waiting Lock try again soon
	// but a notification.
	r1 := newClient(t, b).RWMutex(name)
	must(t, r1.RLock(ctx))
	own := dsync.WithOwner(ctx)
	rw := newClient(t, b, opts...).RWMutex(name) // default TTL: its place lasts 30 s
	werr := async(func() error { return rw.Lock(own) })
	waitZCard(t, rdb, rwk(name).WaitingWriters, 1, "the owner's Lock to wait")

	c := newClient(t, b).RWMutex(name)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cerr := async(func() error { return c.RLock(cctx) })
	waitFor(t, 5*time.Second, "the other reader to wait", func() bool {
		n, _ := rdb.Exists(ctx, rwk(name).WaitingReaders).Result()
		return n == 1
	})
	// The owner reads: its own waiting Lock does not hold it back.
	if ok, err := rw.TryRLock(own); !ok || err != nil {
		t.Fatalf("the owner's TryRLock while its Lock waits = %v, %v; want true", ok, err)
	}
	var refused time.Time
	select {
	case err := <-werr:
		mustIs(t, err, dsync.ErrUpgrade, "the owner's waiting Lock once it reads = %v, want ErrUpgrade")
		refused = time.Now()
	case <-time.After(8 * time.Second):
		t.Fatal("the owner's waiting Lock not refused within 8 s of the owner's read (it waits on, its place holding readers back: until a reader's lease deadline or half its TTL, 15 s)")
	}
	if n, _ := rdb.ZCard(ctx, rwk(name).WaitingWriters).Result(); n != 0 {
		t.Fatalf("waiting writers after the refusal = %d, want 0", n)
	}
	select {
	case err := <-cerr:
		must(t, err)
		if d := time.Since(refused); d > 8*time.Second {
			t.Errorf("reader admitted %v after the only waiting writer's place went", d)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("reader still blocked 8 s after the only waiting writer's place went (it waits for the dropped place to lapse, 30 s)")
	}
	must(t, c.RUnlock(ctx))
	must(t, rw.RUnlock(own))
	must(t, r1.RUnlock(ctx))
	assertRWReleased(t, b, name)
}

// A reader whose renewals stall loses its share while a writer waits: the
// writer gets in once the reader's lease ran out in Redis (not before, not
// a TTL of its own later), and the reader's RUnlock says ErrLeaseLost,
// changing nothing of the writer's hold. Owner (both reentrancy modes, two
// levels) and handle.
func TestRWMutexStalledReaderLosesToWaitingWriter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		owned bool
		opts  []dsync.Option
	}{
		{"handle", false, nil},
		{"owner script", true, nil},
		{"owner client", true, []dsync.Option{dsync.ClientReentrancy()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, ctx, name := realName(t)
			rdb := b.NewClient(t)
			const ttl = 600 * time.Millisecond
			rc := newClient(t, b, tc.opts...)
			r := rc.RWMutex(name, dsync.TTL(ttl))
			rctx := ctx
			levels := 1
			if tc.owned {
				rctx, levels = dsync.WithOwner(ctx), 2
			}
			for i := 0; i < levels; i++ {
				must(t, r.RLock(rctx))
			}
			l, err := r.RLease(rctx)
			must(t, err)
			w := newClient(t, b).RWMutex(name) // TTL 30 s
			werr := async(func() error { return w.Lock(ctx) })
			waitZCard(t, rdb, rwk(name).WaitingWriters, 1, "the writer to wait")
			release := make(chan struct{})
			stalled := make(chan struct{}, 1)
			dsync.SetRenewStall(rc, func() {
				select {
				case stalled <- struct{}{}:
				default:
				}
				<-release
			})
			defer close(release)
			<-stalled
			stallAt := time.Now()
			select {
			case err := <-werr:
				must(t, err)
			case <-time.After(5 * time.Second):
				t.Fatal("writer not in 5 s after the reader's renewals stalled (lease 600 ms)")
			}
			if d := time.Since(stallAt); d > ttl+2*time.Second {
				t.Errorf("writer in %v after the stall, want about the reader's lease", d)
			}
			waitDone(t, l, 5*time.Second, "(the stalled reader's lease)")
			assertLeaseLost(t, l)
			checkIs(t, r.RUnlock(rctx), dsync.ErrLeaseLost, "RUnlock of the lost read hold = %v, want ErrLeaseLost")
			for i := 1; i < levels; i++ {
				if err := r.RUnlock(rctx); !errors.Is(err, dsync.ErrNotHeld) && !errors.Is(err, dsync.ErrLeaseLost) {
					t.Errorf("RUnlock %d of the lost hold = %v, want ErrNotHeld or ErrLeaseLost", i+1, err)
				}
			}
			wl, err := w.Lease(ctx)
			must(t, err)
			if wl.Err() != nil {
				t.Fatalf("writer's lease after the lost reader's RUnlock: %v", wl.Err())
			}
			if n, _ := rdb.Exists(ctx, rwk(name).Writer).Result(); n != 1 {
				t.Fatal("the writer's hash is gone after the lost reader's RUnlock")
			}
			must(t, w.Unlock(ctx))
			assertRWReleased(t, b, name)
		})
	}
}

// Unlock and RUnlock in the wrong mode, or by a non-holder, say
// ErrNotHeld and change nothing in Redis: the writer hash and the readers'
// records stay as they were.
func TestRWMutexWrongModeUnlockChangesNothing(t *testing.T) {
	for _, mode := range reentrancyModes {
		t.Run(mode.name, func(t *testing.T) {
			b, ctx, name := realName(t)
			rdb := b.NewClient(t)
			c := newClient(t, b, mode.opts...)
			rw := c.RWMutex(name)
			own := dsync.WithOwner(ctx)
			snap := func() string {
				w, _ := rdb.HGetAll(ctx, rwk(name).Writer).Result()
				r, _ := rdb.HGetAll(ctx, rwk(name).ReaderData).Result()
				z, _ := rdb.ZRange(ctx, rwk(name).Readers, 0, -1).Result()
				return fmt.Sprint(w, r, z)
			}
			// The owner writes twice and reads once (a downgrade).
			must(t, rw.Lock(own))
			must(t, rw.Lock(own))
			must(t, rw.RLock(own))
			h2 := c.RWMutex(name)
			before := snap()
			other := dsync.WithOwner(ctx)
			mustIs(t, rw.Unlock(other), dsync.ErrNotHeld, "Unlock by another owner = %v")
			mustIs(t, rw.RUnlock(other), dsync.ErrNotHeld, "RUnlock by another owner = %v")
			mustIs(t, h2.RUnlock(ctx), dsync.ErrNotHeld, "RUnlock of a handle holding nothing = %v")
			mustIs(t, h2.Unlock(ctx), dsync.ErrNotHeld, "Unlock of a handle holding nothing = %v")
			mustIs(t, rw.Unlock(ctx), dsync.ErrNotHeld, "Unlock without owner through the owner's handle = %v")
			if after := snap(); after != before {
				t.Fatalf("state changed by refused unlocks:\n%s\n%s", before, after)
			}
			// The owner's levels: write 2, read 1.
			must(t, rw.RUnlock(own))
			mustIs(t, rw.RUnlock(own), dsync.ErrNotHeld, "second RUnlock of a one-level read = %v")
			must(t, rw.Unlock(own))
			must(t, rw.Unlock(own))
			mustIs(t, rw.Unlock(own), dsync.ErrNotHeld, "third Unlock of a two-level write = %v")
			mustIs(t, rw.RUnlock(ctx), dsync.ErrNotHeld, "RUnlock without owner through the owner's handle = %v")
			// A handle reads: its Unlock is refused, its RUnlock ends it.
			h := c.RWMutex(name)
			must(t, h.RLock(ctx))
			before = snap()
			mustIs(t, h.Unlock(ctx), dsync.ErrNotHeld, "Unlock of a reading handle = %v")
			mustIs(t, h.Unlock(own), dsync.ErrNotHeld, "Unlock by an owner through a reading handle = %v")
			if after := snap(); after != before {
				t.Fatalf("state changed by refused unlocks:\n%s\n%s", before, after)
			}
			must(t, h.RUnlock(ctx))
			assertRWReleased(t, b, name)
		})
	}
}

// An upgrade under client reentrancy, with read levels counted in the
// process: Lock and TryLock say ErrUpgrade at once, leave no waiting
// place, and the owner writes once it stopped reading.
func TestRWMutexClientReentrancyUpgrade(t *testing.T) {
	b, ctx, name := realName(t)
	rdb := b.NewClient(t)
	rw := newClient(t, b, dsync.ClientReentrancy()).RWMutex(name)
	own := dsync.WithOwner(ctx)
	must(t, rw.RLock(own))
	must(t, rw.RLock(own))
	lctx, cancel := context.WithTimeout(own, 3*time.Second)
	defer cancel()
	mustIs(t, rw.Lock(lctx), dsync.ErrUpgrade, "Lock while reading (2 levels) = %v, want ErrUpgrade")
	if ok, err := rw.TryLock(own); ok || !errors.Is(err, dsync.ErrUpgrade) {
		t.Fatalf("TryLock while reading = %v, %v; want ErrUpgrade", ok, err)
	}
	if n, _ := rdb.Exists(ctx, rwk(name).WaitingWriters, rwk(name).WriterQueue).Result(); n != 0 {
		t.Fatal("a refused upgrade left a waiting place")
	}
	must(t, rw.RUnlock(own))
	mustIs(t, rw.Lock(lctx), dsync.ErrUpgrade, "Lock while reading (1 level) = %v, want ErrUpgrade")
	must(t, rw.RUnlock(own))
	must(t, rw.Lock(own))
	must(t, rw.Unlock(own))
	assertRWReleased(t, b, name)
}

// lockGate holds every rwmutex_lock script call of its connection, once
// armed, until opened (then lets all through).
type lockGate struct {
	sha   string
	mu    sync.Mutex
	armed bool
	open  chan struct{}
	held  chan struct{} // a send when a call is first held
}

func newLockGate() *lockGate {
	return &lockGate{sha: lua.Script("rwmutex_lock").Hash(), open: make(chan struct{}), held: make(chan struct{}, 1)}
}

func (g *lockGate) arm() { g.mu.Lock(); g.armed = true; g.mu.Unlock() }

func (g *lockGate) wait(cmds ...redis.Cmder) {
	g.mu.Lock()
	armed := g.armed
	g.mu.Unlock()
	if !armed {
		return
	}
	for _, c := range cmds {
		if a := c.Args(); c.Name() == "evalsha" && len(a) > 1 && a[1] == g.sha {
			select {
			case g.held <- struct{}{}:
			default:
			}
			<-g.open
			return
		}
	}
}

func (g *lockGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *lockGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { g.wait(cmd); return next(ctx, cmd) }
}
func (g *lockGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { g.wait(cmds...); return next(ctx, cmds) }
}

// An owner's Lock waits for a writer, and its read (from another process,
// the same owner token) waits too; the writer's Unlock admits the read,
// so the owner's Lock is an upgrade now, but its place stays until that
// Lock's next attempt. That attempt is refused (ErrUpgrade) and drops the
// place: a reader that came meanwhile, held back by the place alone, must
// go on at once, not once the dropped place would have lapsed.
func TestRWMutexUpgradeRefusalAfterAdmissionWakesReaders(t *testing.T) {
	b, ctx, name := realName(t)
	rdb := b.NewClient(t)
	ctx, cancelAll := context.WithTimeout(ctx, 40*time.Second)
	defer cancelAll()
	gate := newLockGate()
	lc, _ := hookedClient(t, b, gate)
	wl := lc.RWMutex(name)
	must(t, wl.RLock(ctx)) // loads the scripts
	must(t, wl.RUnlock(ctx))
	x := newClient(t, b).RWMutex(name)
	must(t, x.Lock(ctx))
	own := dsync.WithOwner(ctx)
	werr := async(func() error { return wl.Lock(own) })
	waitZCard(t, rdb, rwk(name).WaitingWriters, 1, "the owner's Lock to wait")
	rerr := async(func() error {
		return newClient(t, b).RWMutex(name).RLock(dsync.WithOwnerToken(ctx, dsync.OwnerToken(own)))
	})
	waitFor(t, 5*time.Second, "the owner's RLock to wait", func() bool {
		n, _ := rdb.HLen(ctx, rwk(name).WaitingReaders).Result()
		return n == 1
	})
	gate.arm()
	must(t, x.Unlock(ctx))
	recvNil(t, rerr, 5*time.Second, "the owner's RLock not admitted by the writer's Unlock")
	select {
	case <-gate.held: // the owner's Lock tries again, held back here
	case <-time.After(5 * time.Second):
		t.Fatal("the owner's Lock not woken by the writer's Unlock")
	}
	d := newClient(t, b).RWMutex(name)
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	derr := async(func() error { return d.RLock(dctx) })
	waitFor(t, 5*time.Second, "the late reader to wait", func() bool {
		n, _ := rdb.HLen(ctx, rwk(name).WaitingReaders).Result()
		return n == 1
	})
	close(gate.open)
	select {
	case err := <-werr:
		mustIs(t, err, dsync.ErrUpgrade, "the owner's Lock once it reads = %v, want ErrUpgrade")
	case <-time.After(5 * time.Second):
		t.Fatal("the owner's Lock not refused")
	}
	refused := time.Now()
	select {
	case err := <-derr:
		must(t, err)
		if d := time.Since(refused); d > 8*time.Second {
			t.Errorf("late reader admitted %v after the upgrade's place went", d)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("late reader still blocked 8 s after the refused upgrade dropped the only writer place (it waits for the place to lapse, 30 s)")
	}
	must(t, d.RUnlock(ctx))
	must(t, wl.RUnlock(own))
	assertRWReleased(t, b, name)
}
