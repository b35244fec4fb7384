package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// lateFault returns faults on script for the tests below: the next
// faults it is armed with (arm) hold the release for delay and then lose
// its reply after it ran (ran) or fail it unsent, after a caller that
// waits a shorter time gave up on it.
func lateFault(script string, delay time.Duration, ran bool) (f *redistest.Faults, arm func(n int)) {
	f = scriptFaults(script)
	f.Delay(delay)
	return f, func(n int) {
		if ran {
			f.DropReplyNext(n, nil)
		} else {
			f.FailNext(n, nil)
		}
	}
}

// leftKinds are the owner holds whose release an Unlock (or Release) of
// one level makes, with the script that releases them and a check, through
// another Client, that another owner can take the name.
func leftKinds() []struct {
	name, script string
	hold         holdKind
	free         func(ctx context.Context, c *dsync.Client, name string) (bool, error)
} {
	lockFree := func(ctx context.Context, c *dsync.Client, name string) (bool, error) {
		other := dsync.WithOwner(ctx)
		m := c.Mutex(name)
		ok, err := m.TryLock(other)
		if ok {
			err = errors.Join(err, m.Unlock(other))
		}
		return ok, err
	}
	rwFree := func(ctx context.Context, c *dsync.Client, name string) (bool, error) {
		other := dsync.WithOwner(ctx)
		rw := c.RWMutex(name)
		ok, err := rw.TryLock(other)
		if ok {
			err = errors.Join(err, rw.Unlock(other))
		}
		return ok, err
	}
	semFree := func(ctx context.Context, c *dsync.Client, name string) (bool, error) {
		other := dsync.WithOwner(ctx)
		s := c.Semaphore(name, 2)
		ok, err := s.TryAcquire(other, 2)
		if ok {
			err = errors.Join(err, s.Release(other, 2))
		}
		return ok, err
	}
	return []struct {
		name, script string
		hold         holdKind
		free         func(ctx context.Context, c *dsync.Client, name string) (bool, error)
	}{
		{"Mutex", "mutex_unlock", mutexHold, lockFree},
		{"RWMutex write", "rwmutex_unlock", writeHold, rwFree},
		{"RWMutex read", "rwmutex_unlock", readHold, rwFree},
		{"Semaphore", "semaphore_release", semHold(2, 1), semFree},
	}
}

// An Unlock whose ctx ended returns then, and its release completes in
// the background, not to be repeated. When that release's reply is lost
// too (it ran, or it never arrived), the release is sent again under its
// call id until a reply tells its outcome; the call id is not kept for a
// repeat that is not coming. Before, the owner's next Unlock (of its last
// level) was taken for that repeat: it changed nothing and returned nil,
// and the name stayed held, renewed, for good.
func TestUnlockLeftWithLostReplyIsSettledInTheBackground(t *testing.T) {
	for _, k := range leftKinds() {
		for _, ran := range []bool{true, false} {
			variant := "release ran, reply lost"
			if !ran {
				variant = "release never arrived"
			}
			t.Run(k.name+"/"+variant, func(t *testing.T) {
				eachBackend(t, func(t *testing.T, b redistest.Backend) {
					ctx, name := ctxT(t), redistest.Key(t)
					// The fault holds the release well past the grace the
					// cancelled caller waits for its outcome (20 ms).
					fault, arm := lateFault(k.script, 400*time.Millisecond, ran)
					c, _ := hookedClient(t, b, fault)
					probe := newClient(t, b)
					h := k.hold(c, name)
					own := dsync.WithOwner(ctx)
					warmUp(t, ctx, h)
					must(t, h.lock(own))
					must(t, h.lock(own))

					cctx, cancel := context.WithCancel(own)
					cancel()
					arm(1)
					mustIs(t, h.unlock(cctx), context.Canceled, "Unlock with a cancelled ctx, its release held up: %v, want the ctx's error")
					dsync.WaitCleanups(c)
					if n := fault.Injected(); n != 1 {
						t.Fatalf("the fault hit %d releases, want 1", n)
					}
					free, err := k.free(ctx, probe, name)
					must(t, err)
					if free {
						t.Fatal("free after one Unlock of two levels")
					}
					// The last level's Unlock, a call of its own.
					must(t, h.unlock(own))
					free, err = k.free(ctx, probe, name)
					must(t, err)
					if !free {
						t.Fatal("after two Locks and two Unlocks (the first left to the background, its reply lost), the name is still held")
					}
					mustIs(t, h.unlock(own), dsync.ErrNotHeld, "a third Unlock after two Locks: %v, want ErrNotHeld")
				})
			})
		}
	}
}

// A handle's Unlock (no owner) whose ctx ended, and whose release's reply
// is lost: the release is settled in the background, and the handle is
// unlocked, as its caller was told. Before, the handle kept the hold (and
// its renewal) until another Unlock, which the caller had been told not to
// make, and a Lock through the handle waited for it.
func TestHandleUnlockLeftWithLostReplyUnlocksTheHandle(t *testing.T) {
	for _, k := range leftKinds()[:2] {
		t.Run(k.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b redistest.Backend) {
				ctx, name := ctxT(t), redistest.Key(t)
				fault, arm := lateFault(k.script, 400*time.Millisecond, true)
				c, _ := hookedClient(t, b, fault)
				probe := newClient(t, b)
				h := k.hold(c, name)
				warmUp(t, ctx, h)
				must(t, h.lock(ctx))
				cctx, cancel := context.WithCancel(ctx)
				cancel()
				arm(1)
				mustIs(t, h.unlock(cctx), context.Canceled, "Unlock with a cancelled ctx, its release held up: %v, want the ctx's error")
				dsync.WaitCleanups(c)
				free, err := k.free(ctx, probe, name)
				must(t, err)
				if !free {
					t.Fatal("the name is still held after its Unlock completed in the background")
				}
				lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				must(t, h.lock(lctx))
				must(t, h.unlock(ctx))
			})
		})
	}
}

// The same, with Redis out of reach for the whole time the release is sent
// again: the owner's level counts as released once the release gives up,
// so the owner's next Unlock is a call of its own, and its hold, no longer
// renewed, ends at its TTL (the release that never arrived left one level
// in Redis). Before, that Unlock was taken for a repeat of the lost one,
// and the hold stayed, renewed, for good.
func TestUnlockLeftUnreachableForgetsTheLevel(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx, name := ctxT(t), redistest.Key(t)
		fault, arm := lateFault("mutex_unlock", 400*time.Millisecond, false)
		c, _ := hookedClient(t, b, fault, dsync.TTL(time.Second))
		probe := newClient(t, b)
		m := c.Mutex(name)
		own := dsync.WithOwner(ctx)
		warmUp(t, ctx, mutexHold(c, name))
		must(t, m.Lock(own))
		must(t, m.Lock(own))
		l, err := m.Lease(own)
		must(t, err)

		cctx, cancel := context.WithCancel(own)
		cancel()
		arm(1 << 20) // every release, until disarmed
		mustIs(t, m.Unlock(cctx), context.Canceled, "Unlock with a cancelled ctx, its release held up: %v, want the ctx's error")
		dsync.WaitCleanups(c) // the release gives up (5 s)
		if n := fault.Injected(); n < 2 {
			t.Fatalf("the release was sent %d times, want it sent again", n)
		}
		arm(0)
		must(t, m.Unlock(own))
		waitDone(t, l, 5*time.Second, "the last Unlock")
		b.Advance(1500 * time.Millisecond) // past the TTL (on miniredis, its clock)
		waitFor(t, 5*time.Second, "the name free at the TTL of the level left in Redis", func() bool {
			other := dsync.WithOwner(ctx)
			ok, err := probe.Mutex(name).TryLock(other)
			must(t, err)
			return ok
		})
		mustIs(t, m.Unlock(own), dsync.ErrNotHeld, "a third Unlock after two Locks: %v, want ErrNotHeld")
	})
}

// A release whose reply was lost ended the hold; the renewer, finding the
// hold gone, reports the lease lost (it cannot tell a release from a
// loss). The caller's repeat of the release, which finds the hold ended by
// that release, did release it: it returns nil, not ErrLeaseLost. Before,
// it returned ErrLeaseLost whenever a renewal came between the two.
func TestReleaseRepeatedAfterALostReplyAndARenewal(t *testing.T) {
	kinds := []struct {
		name, script string
		hold         holdKind
		owned        bool
	}{
		{"Mutex, owner", "mutex_unlock", mutexHold, true},
		{"Mutex, handle", "mutex_unlock", mutexHold, false},
		{"RWMutex write, owner", "rwmutex_unlock", writeHold, true},
		{"RWMutex write, handle", "rwmutex_unlock", writeHold, false},
		{"RWMutex read, owner", "rwmutex_unlock", readHold, true},
		{"Semaphore, owner", "semaphore_release", semHold(2, 2), true},
		{"Semaphore, handle", "semaphore_release", semHold(2, 2), false},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b redistest.Backend) {
				ctx, name := ctxT(t), redistest.Key(t)
				faults := scriptFaults(k.script)
				c, _ := hookedClient(t, b, faults, dsync.TTL(600*time.Millisecond))
				if k.owned {
					ctx = dsync.WithOwner(ctx)
				}
				h := k.hold(c, name)
				warmUp(t, ctx, h)
				must(t, h.lock(ctx))
				l, err := h.lease(ctx)
				must(t, err)
				faults.DropReplyNext(1, nil)
				if err := h.unlock(ctx); err == nil {
					t.Fatal("the release whose reply was lost returned nil")
				}
				// The renewer finds the hold gone (every 200 ms).
				if b.Mini != nil {
					b.Advance(time.Second)
				}
				waitDone(t, l, 5*time.Second, "the release whose reply was lost")
				must(t, h.unlock(ctx))
			})
		})
	}
}

// warmUp takes and releases a hold through h without an owner, so that the
// server has loaded the scripts: a fault that hides a NOSCRIPT reply would
// stand for a script that never ran.
func warmUp(t *testing.T, ctx context.Context, h holdCalls) {
	t.Helper()
	must(t, h.lock(ctx))
	must(t, h.unlock(ctx))
}
