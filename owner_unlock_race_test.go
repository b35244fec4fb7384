package dsync_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// Quorum: an owner's Unlock in a process that holds nothing of it (the
// token carried over) names no hold; each master answers {1, token}.
func TestQuorumUnnamedUnlockOfCarriedOwner(t *testing.T) {
	for _, kind := range []string{"Mutex", "RWMutex"} {
		t.Run(kind, func(t *testing.T) {
			_, rdbs, q1 := miniQuorumEnv(t)
			q2 := newQuorum(t, rdbs)
			ctx := dsync.WithOwner(ctxT(t))
			ctx2 := dsync.WithOwnerToken(ctxT(t), dsync.OwnerToken(ctx))
			name := "zzq-" + kind
			var lock, unlock2 func(context.Context) error
			var try3 func(context.Context) (bool, error)
			q3 := newQuorum(t, rdbs)
			if kind == "Mutex" {
				lock, unlock2, try3 = q1.Mutex(name).Lock, q2.Mutex(name).Unlock, q3.Mutex(name).TryLock
			} else {
				lock, unlock2, try3 = q1.RWMutex(name).Lock, q2.RWMutex(name).Unlock, q3.RWMutex(name).TryLock
			}
			must(t, lock(ctx))
			if err := unlock2(ctx2); err != nil {
				t.Fatalf("Unlock in the other process: %v", err)
			}
			ok, err := try3(context.Background())
			must(t, err)
			if !ok {
				t.Fatal("name still held after the owner's Unlock")
			}
		})
	}
}

// An owner O's Lock call A is granted a fresh hold F1 (its reply held
// back); meanwhile an Unlock B of O from another goroutine, sent while O
// has nothing on record in the Client, names no hold and ends F1 in
// Redis (its reply held back too). A's reply comes first: A returns,
// holding F1 on record. Then B's reply comes, saying that it ended F1.
// From then on the Client knows F1 is over in Redis: A's Lease must not
// report it live while another owner holds the name.
func TestOwnerHoldEndedByUnlockWhoseReplyCameAfterTheLock(t *testing.T) {
	for _, kind := range []string{"mutex", "write"} {
		for _, mode := range reentrancyModes {
			t.Run(kind+"/"+mode.name, func(t *testing.T) {
				eachBackend(t, func(t *testing.T, b redistest.Backend) {
					ctx, name := ctxT(t), redistest.Key(t)
					octx := dsync.WithOwner(ctx)
					hk := newOnceHook()
					c, _ := hookedClient(t, b, hk, mode.opts...)
					other := newClient(t, b)
					var h, x ownerLocker
					lockScript, unlockScript := "mutex_lock", "mutex_unlock"
					if kind == "mutex" {
						h, x = c.Mutex(name), other.Mutex(name)
					} else {
						h, x = c.RWMutex(name), other.RWMutex(name)
						lockScript, unlockScript = "rwmutex_lock", "rwmutex_unlock"
					}
					// Load the scripts.
					must(t, h.Lock(octx))
					must(t, h.Unlock(octx))

					ranL, relL := hk.holdReply(t, lockScript)
					aIn := async(func() error { return h.Lock(octx) })
					ranL("A's lock")
					ranU, relU := hk.holdReply(t, unlockScript)
					bOut := async(func() error { return h.Unlock(octx) })
					ranU("B's unlock")
					relL()
					recvNil(t, aIn, 10*time.Second, "A's Lock did not return")
					l, err := h.Lease(octx)
					must(t, err)
					relU()
					recvNil(t, bOut, 10*time.Second, "B's Unlock did not return")

					// F1 is gone in Redis: another owner gets in.
					ok, err := x.TryLock(dsync.WithOwner(ctx))
					must(t, err)
					if !ok {
						t.Fatalf("another owner's TryLock refused: B's Unlock did not end F1?")
					}
					if err := l.Err(); err == nil {
						t.Errorf("A's Lease of F1 reports live (Err nil) after B's Unlock reply said it ended F1, while another owner holds the name")
					}
					// A's Unlock names F1: ErrLeaseLost, and the other
					// owner's hold stays.
					checkIs(t, h.Unlock(octx), dsync.ErrLeaseLost, "A's Unlock of F1: %v, want ErrLeaseLost")
					ok, err = x.TryLock(dsync.WithOwner(ctx))
					must(t, err)
					if ok {
						t.Errorf("a third owner got in: A's Unlock ended the other owner's hold")
					}
				})
			})
		}
	}
}
