package dsync_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// The read-hold kin of TestOwnerHoldEndedByUnlockWhoseReplyCameAfterTheLock:
// an owner O's RLock call A is granted a read hold R1 (its reply held
// back); an RUnlock B of O, sent while O has nothing on record, names no
// hold and ends R1 (its reply held back too). lockFirst: A's reply comes
// first, A returns holding R1 on record, then B's reply says it ended R1:
// A's read Lease must not report R1 live while a writer of another owner
// holds the name, and A's RUnlock says ErrLeaseLost. Otherwise B's reply
// comes first: A's grant is of a hold that has ended, and A takes the read
// lock afresh (a writer is then refused), rather than return with a read
// hold that Redis does not have.
func TestOwnerReadHoldEndedByUnnamedRUnlock(t *testing.T) {
	for _, lockFirst := range []bool{true, false} {
		for _, mode := range reentrancyModes {
			order := "runlock-reply-first"
			if lockFirst {
				order = "rlock-reply-first"
			}
			t.Run(order+"/"+mode.name, func(t *testing.T) {
				eachBackend(t, func(t *testing.T, b redistest.Backend) {
					ctx, name := ctxT(t), redistest.Key(t)
					octx := dsync.WithOwner(ctx)
					hk := newOnceHook()
					c, _ := hookedClient(t, b, hk, mode.opts...)
					other := newClient(t, b)
					h, x := c.RWMutex(name), other.RWMutex(name)
					// Load the scripts.
					must(t, h.RLock(octx))
					must(t, h.RUnlock(octx))

					ranL, relL := hk.holdReply(t, "rwmutex_lock")
					aIn := async(func() error { return h.RLock(octx) })
					ranL("A's rlock")
					ranU, relU := hk.holdReply(t, "rwmutex_unlock")
					bOut := async(func() error { return h.RUnlock(octx) })
					ranU("B's runlock")
					if !lockFirst {
						relU()
						recvNil(t, bOut, 10*time.Second, "B's RUnlock did not return")
					}
					relL()
					recvNil(t, aIn, 10*time.Second, "A's RLock did not return")
					l, err := h.RLease(octx)
					must(t, err)
					if !lockFirst {
						if err := l.Err(); err != nil {
							t.Fatalf("A's read Lease after a fresh read: %v", err)
						}
						ok, err := x.TryLock(dsync.WithOwner(ctx))
						must(t, err)
						if ok {
							t.Fatalf("a writer of another owner got in while A's RLock returned with a read hold (A holds nothing in Redis)")
						}
						must(t, h.RUnlock(octx))
						return
					}
					relU()
					recvNil(t, bOut, 10*time.Second, "B's RUnlock did not return")
					ok, err := x.TryLock(dsync.WithOwner(ctx))
					must(t, err)
					if !ok {
						t.Fatalf("a writer of another owner refused: B's RUnlock did not end R1?")
					}
					if err := l.Err(); err == nil {
						t.Errorf("A's read Lease of R1 reports live (Err nil) after B's RUnlock reply said it ended R1, while another owner writes")
					}
					checkIs(t, h.RUnlock(octx), dsync.ErrLeaseLost, "A's RUnlock of R1: %v, want ErrLeaseLost")
				})
			})
		}
	}
}

// TestOwnerHoldEndedByUnlockWhoseReplyCameAfterTheLock and its read-hold
// kin in quorum mode (3 masters): A's Lock (or RLock) is granted on every
// master, its replies held back; B's Unlock (RUnlock), naming no hold,
// ends the hold on every master, its replies held back too; A's replies
// come first. Once B's replies say which member holds they ended, A's
// Lease is lost, and its Unlock says ErrLeaseLost.
func TestQuorumOwnerHoldEndedByUnnamedUnlock(t *testing.T) {
	for _, kind := range []string{"mutex", "write", "read"} {
		for _, mode := range reentrancyModes {
			t.Run(kind+"/"+mode.name, func(t *testing.T) {
				bs, _, _ := miniQuorumEnv(t)
				var rdbs, plain []redis.UniversalClient
				var hooks []*onceHook
				for _, b := range bs {
					r := b.NewClient(t)
					hk := newOnceHook()
					r.AddHook(hk)
					rdbs, hooks = append(rdbs, r), append(hooks, hk)
					plain = append(plain, b.NewClient(t))
				}
				q, other := newQuorum(t, rdbs, mode.opts...), newQuorum(t, plain)
				ctx, name := ctxT(t), redistest.Key(t)
				octx := dsync.WithOwner(ctx)
				lockScript, unlockScript := "rwmutex_lock", "rwmutex_unlock"
				var lock, unlock func(context.Context) error
				var lease func(context.Context) (*dsync.Lease, error)
				x := other.RWMutex(name)
				switch kind {
				case "mutex":
					m := q.Mutex(name)
					lock, unlock, lease = m.Lock, m.Unlock, m.Lease
					lockScript, unlockScript = "mutex_lock", "mutex_unlock"
				case "write":
					rw := q.RWMutex(name)
					lock, unlock, lease = rw.Lock, rw.Unlock, rw.Lease
				default:
					rw := q.RWMutex(name)
					lock, unlock, lease = rw.RLock, rw.RUnlock, rw.RLease
				}
				writerIn := func() (bool, error) {
					if kind == "mutex" {
						return other.Mutex(name).TryLock(dsync.WithOwner(ctx))
					}
					return x.TryLock(dsync.WithOwner(ctx))
				}
				// Load the scripts.
				must(t, lock(octx))
				must(t, unlock(octx))

				var relLs, relUs []func()
				var ranLs, ranUs []func(string)
				for _, hk := range hooks {
					ran, rel := hk.holdReply(t, lockScript)
					ranLs, relLs = append(ranLs, ran), append(relLs, rel)
				}
				aIn := async(func() error { return lock(octx) })
				for _, ran := range ranLs {
					ran("A's lock")
				}
				for _, hk := range hooks {
					ran, rel := hk.holdReply(t, unlockScript)
					ranUs, relUs = append(ranUs, ran), append(relUs, rel)
				}
				bOut := async(func() error { return unlock(octx) })
				for _, ran := range ranUs {
					ran("B's unlock")
				}
				for _, rel := range relLs {
					rel()
				}
				recvNil(t, aIn, 10*time.Second, "A's lock did not return")
				l, err := lease(octx)
				must(t, err)
				for _, rel := range relUs {
					rel()
				}
				recvNil(t, bOut, 10*time.Second, "B's unlock did not return")
				ok, err := writerIn()
				must(t, err)
				if !ok {
					t.Fatalf("another owner's writer refused: B's unlock did not end A's hold")
				}
				select {
				case <-l.Done():
				case <-time.After(5 * time.Second):
				}
				if err := l.Err(); err == nil {
					t.Errorf("A's Lease reports live after B's unlock replies said they ended its member holds, while another owner writes")
				}
				checkIs(t, unlock(octx), dsync.ErrLeaseLost, "A's unlock: %v, want ErrLeaseLost")
			})
		}
	}
}

// The other reply order of TestQuorumOwnerHoldEndedByUnnamedUnlock: A's
// Lock (or RLock) is granted on every master, its replies held back; B's
// Unlock (RUnlock) of the owner, naming no hold, ends A's grant on every
// master, its replies held back too; B's replies come first, on every
// master or on a majority (the last one's after A returned). A's grants
// are then of member holds that have ended where B's reply came first, so
// A takes the lock again, as on one deployment, rather than return with a
// quorum hold Redis does not have. Judged by Redis-side truth: A's Lease,
// if live, is of a hold the owner has on a majority of the masters, which
// keeps other owners out; and A's Unlock of it releases it.
func TestQuorumOwnerGrantEndedByUnnamedUnlockReplyFirst(t *testing.T) {
	for _, kind := range []string{"mutex", "write", "read"} {
		for _, mode := range reentrancyModes {
			for _, first := range []int{3, 2} {
				t.Run(fmt.Sprintf("%s/%s/unlock-replies-first=%d", kind, mode.name, first), func(t *testing.T) {
					testQuorumGrantEndedByUnlockReplyFirst(t, kind, mode.opts, first)
				})
			}
		}
	}
}

func testQuorumGrantEndedByUnlockReplyFirst(t *testing.T, kind string, opts []dsync.Option, first int) {
	bs, _, _ := miniQuorumEnv(t)
	var rdbs, plain []redis.UniversalClient
	var hooks []*onceHook
	for _, b := range bs {
		r := b.NewClient(t)
		hk := newOnceHook()
		r.AddHook(hk)
		rdbs, hooks = append(rdbs, r), append(hooks, hk)
		plain = append(plain, b.NewClient(t))
	}
	q, other := newQuorum(t, rdbs, opts...), newQuorum(t, plain)
	ctx, name := ctxT(t), redistest.Key(t)
	octx := dsync.WithOwner(ctx)
	otok := dsync.OwnerToken(octx)
	lockScript, unlockScript := "rwmutex_lock", "rwmutex_unlock"
	var lock, unlock func(context.Context) error
	var lease func(context.Context) (*dsync.Lease, error)
	writerIn := func() (bool, error) { return other.RWMutex(name).TryLock(dsync.WithOwner(ctx)) }
	switch kind {
	case "mutex":
		m := q.Mutex(name)
		lock, unlock, lease = m.Lock, m.Unlock, m.Lease
		lockScript, unlockScript = "mutex_lock", "mutex_unlock"
		writerIn = func() (bool, error) { return other.Mutex(name).TryLock(dsync.WithOwner(ctx)) }
	case "write":
		rw := q.RWMutex(name)
		lock, unlock, lease = rw.Lock, rw.Unlock, rw.Lease
	default:
		rw := q.RWMutex(name)
		lock, unlock, lease = rw.RLock, rw.RUnlock, rw.RLease
	}
	// heldOn counts the masters where the owner holds the name in Redis.
	heldOn := func() int {
		n := 0
		for _, rdb := range plain {
			var holders []string
			switch kind {
			case "mutex":
				holders = slices.Collect(maps.Keys(rdb.HGetAll(ctx, mutexKeys(name).Lock).Val()))
			case "write":
				holders = slices.Collect(maps.Keys(rdb.HGetAll(ctx, rwKeys(name).Writer).Val()))
			default:
				holders = rdb.ZRange(ctx, rwKeys(name).Readers, 0, -1).Val()
			}
			if slices.ContainsFunc(holders, func(h string) bool { return h == otok || strings.HasPrefix(h, otok+"@") }) {
				n++
			}
		}
		return n
	}
	// Load the scripts.
	must(t, lock(octx))
	must(t, unlock(octx))

	var relLs, relUs []func()
	var ranLs, ranUs []func(string)
	for _, hk := range hooks {
		ran, rel := hk.holdReply(t, lockScript)
		ranLs, relLs = append(ranLs, ran), append(relLs, rel)
	}
	aIn := async(func() error { return lock(octx) })
	for _, ran := range ranLs {
		ran("A's lock")
	}
	for _, hk := range hooks {
		ran, rel := hk.holdReply(t, unlockScript)
		ranUs, relUs = append(ranUs, ran), append(relUs, rel)
	}
	bOut := async(func() error { return unlock(octx) })
	for _, ran := range ranUs {
		ran("B's unlock")
	}
	if n := heldOn(); n != 0 {
		t.Fatalf("the owner holds the name on %d masters after B's unlock ran everywhere; want 0", n)
	}
	for _, rel := range relUs[:first] {
		rel()
	}
	recvNil(t, bOut, 10*time.Second, "B's unlock did not return")
	for _, rel := range relLs {
		rel()
	}
	recvNil(t, aIn, 10*time.Second, "A's lock did not return")
	for _, rel := range relUs[first:] {
		rel()
	}
	l, err := lease(octx)
	must(t, err)
	// Let the late replies and the watcher of A's Lease do their part
	// (member renewals, at TTL/3, do not come within this).
	select {
	case <-l.Done():
	case <-time.After(200 * time.Millisecond):
	}
	if err := l.Err(); err != nil {
		t.Fatalf("A's Lease after A's Lock returned (with the lock taken again): %v", err)
	}
	if n := heldOn(); n < 2 {
		t.Fatalf("A's Lease reports live, but the owner holds the name on %d of 3 masters in Redis", n)
	}
	ok, err := writerIn()
	must(t, err)
	if ok {
		t.Fatalf("another owner got in while A's Lease reports live")
	}
	must(t, unlock(octx))
	if n := heldOn(); n != 0 {
		t.Errorf("the owner holds the name on %d masters after A's unlock; want 0", n)
	}
	ok, err = writerIn()
	must(t, err)
	if !ok {
		t.Errorf("another owner refused after A's unlock")
	}
}
