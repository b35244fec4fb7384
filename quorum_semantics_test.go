package dsync_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
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
