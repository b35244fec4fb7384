package dsync_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// slowLoad is a go-redis hook that holds each SCRIPT LOAD of one script
// for a while before it sends it: a slow network on the way to Redis.
type slowLoad struct {
	sha string
	d   time.Duration
}

func (s slowLoad) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s slowLoad) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if cmd.Name() == "script" && len(a) == 3 && strings.EqualFold(a[1].(string), "load") {
			if src, ok := a[2].(string); ok {
				sum := sha1.Sum([]byte(src))
				if hex.EncodeToString(sum[:]) == s.sha {
					time.Sleep(s.d)
				}
			}
		}
		return next(ctx, cmd)
	}
}

func (s slowLoad) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// MaxHold: "no renewal extends a hold past d after it was taken, so a
// live but stuck holder loses it (its Lease reports ErrLeaseLost) within
// d". A renewal checked against MaxHold before the renewer loads its
// script, and sent only once that load is back, extends the hold from
// that later time: here the first renewal of a hold of TTL 6 s and
// MaxHold 8.2 s, due 2 s after the Lock, waits 1.8 s for its SCRIPT LOAD
// (the Client's first renewal loads the script). Once it is back (or the
// hold ran out unrenewed), the Lease's deadline and the server's expiry
// must both lie within MaxHold of the Lock. Before, both lay 9.8 s after
// it: the Lease reported the loss 1.5 s past MaxHold.
func TestMaxHoldBoundsARenewalSentLate(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		// slack: the Lock's send after start, and the PTTL's round trip, on
		// a loaded machine (the defect overshot by 1.5 s).
		const ttl, maxHold, load, slack = 6 * time.Second, 8200 * time.Millisecond, 1800 * time.Millisecond, 500 * time.Millisecond
		c, _ := hookedClient(t, b, slowLoad{lua.Script("mutex_renew").Hash(), load}, dsync.TTL(ttl), dsync.MaxHold(maxHold))
		m := c.Mutex(name)
		start := time.Now()
		l := lockLease(t, ctx, m)
		first := dsync.LeaseDeadline(l)
		// The renewal extends the hold, or (sent too late for MaxHold)
		// it is not sent and the hold runs out.
		waitFor(t, 10*time.Second, "the renewal", func() bool { return !dsync.LeaseDeadline(l).Equal(first) || l.Err() != nil })
		if d := dsync.LeaseDeadline(l).Sub(start); d > maxHold+slack {
			t.Errorf("after the renewal, the Lease is due to end %v after the Lock, want within MaxHold %v", d, maxHold)
		}
		if b.Mini == nil {
			pttl, err := b.NewClient(t).PTTL(ctx, mutexKeys(name).Lock).Result()
			must(t, err)
			if end := time.Since(start) + pttl; end > maxHold+slack {
				t.Errorf("after the renewal, the server keeps the hold until %v after the Lock, want within MaxHold %v", end, maxHold)
			}
		}
		_ = m.Unlock(ctx)
	})
}

// keepOneMinute moves the expiry in Redis of every hold on name of the
// kind of hk out to a minute.
func keepOneMinute(ctx context.Context, rdb redis.UniversalClient, name string, read bool, lock string) error {
	if !read {
		return rdb.PExpire(ctx, lock, time.Minute).Err()
	}
	k := rwk(name)
	tm, err := rdb.Time(ctx).Result()
	if err != nil {
		return err
	}
	readers, err := rdb.ZRange(ctx, k.Readers, 0, -1).Result()
	if err != nil {
		return err
	}
	for _, r := range readers {
		if err := rdb.ZAddXX(ctx, k.Readers, redis.Z{Score: float64(tm.Add(time.Minute).UnixMilli()), Member: r}).Err(); err != nil {
			return err
		}
	}
	if err := rdb.PExpire(ctx, k.Readers, time.Minute).Err(); err != nil {
		return err
	}
	return rdb.PExpire(ctx, k.ReaderData, time.Minute).Err()
}

// An owner's hold of two levels (script reentrancy, the default) whose
// lease was reported lost (renewals held back past its local deadline)
// while the server still had it: "Unlock returns ErrLeaseLost instead of
// pretending", and a lost Lease stays lost. The first Unlock, which ends
// one level in Redis, returned nil, as if the hold were fine; only the
// last one said ErrLeaseLost (with ClientReentrancy the first one says
// so).
func TestUnlockOfALevelOfAHoldReportedLostSaysSo(t *testing.T) {
	kinds := []struct {
		name string
		kind holdKind
		read bool
		key  func(name string) string
	}{
		{"Mutex", mutexHold, false, func(n string) string { return mutexKeys(n).Lock }},
		{"RWMutex.Lock", writeHold, false, func(n string) string { return rwk(n).Writer }},
		{"RWMutex.RLock", readHold, true, nil},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			eachRealName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				ctx = dsync.WithOwner(ctx)
				rdb := b.NewClient(t)
				c := newClient(t, b, dsync.TTL(time.Second))
				h := k.kind(c, name)
				stall := make(chan struct{})
				t.Cleanup(func() { close(stall) })
				l := lockLeaseOf(t, ctx, h, "first Lock")
				must(t, h.lock(ctx))
				lock := ""
				if k.key != nil {
					lock = k.key(name)
				}
				must(t, keepOneMinute(ctx, rdb, name, k.read, lock))
				dsync.SetRenewStall(c, func() { <-stall })
				waitDone(t, l, 10*time.Second, "(renewals held back)")
				assertLeaseLost(t, l)
				checkIs(t, h.unlock(ctx), dsync.ErrLeaseLost, "first Unlock of the lost hold = %v, want ErrLeaseLost")
				if err := h.unlock(ctx); !errors.Is(err, dsync.ErrLeaseLost) && !errors.Is(err, dsync.ErrNotHeld) {
					t.Errorf("second Unlock of the lost hold = %v, want ErrLeaseLost or ErrNotHeld", err)
				}
				assertLeaseLost(t, l)
			})
		})
	}
}

// The same for the hold of a handle without an owner, of one level: its
// Unlock (RUnlock) releases it in Redis and says ErrLeaseLost, as
// TestReleaseOfAHoldReportedLostStillThere checks for a Mutex and a
// Semaphore. An RWMutex handle's RUnlock returned nil.
func TestHandleUnlockOfAHoldReportedLostSaysSo(t *testing.T) {
	kinds := []struct {
		name string
		kind holdKind
		read bool
		key  func(name string) string
	}{
		{"RWMutex.Lock", writeHold, false, func(n string) string { return rwk(n).Writer }},
		{"RWMutex.RLock", readHold, true, nil},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			eachRealName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				rdb := b.NewClient(t)
				c := newClient(t, b, dsync.TTL(time.Second))
				h := k.kind(c, name)
				stall := make(chan struct{})
				t.Cleanup(func() { close(stall) })
				l := lockLeaseOf(t, ctx, h, "Lock")
				lock := ""
				if k.key != nil {
					lock = k.key(name)
				}
				must(t, keepOneMinute(ctx, rdb, name, k.read, lock))
				dsync.SetRenewStall(c, func() { <-stall })
				waitDone(t, l, 10*time.Second, "(renewals held back)")
				assertLeaseLost(t, l)
				checkIs(t, h.unlock(ctx), dsync.ErrLeaseLost, "Unlock of the lost hold = %v, want ErrLeaseLost")
				assertLeaseLost(t, l)
				if !writeFree(t, ctx, newClient(t, b).RWMutex(name)) {
					t.Error("the name is not free after the Unlock")
				}
			})
		})
	}
}

// A Semaphore holding whose lease was reported lost (renewals held back
// past its local deadline) while Redis kept it: a later Acquire through
// the same holder joins it in Redis (same fencing token) and succeeds.
// Those permits are held, so they have a lease that the Client renews;
// with an owner the joined holding gets a new, live lease, but through a
// handle the permits went into the lost holding: Lease right after the
// Acquire reported ErrLeaseLost and nothing renewed them.
func TestSemaphoreAcquireIntoAHoldingReportedLostIsRenewed(t *testing.T) {
	for _, owned := range []bool{false, true} {
		t.Run(fmt.Sprintf("owned=%v", owned), func(t *testing.T) {
			eachRealName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				if owned {
					ctx = dsync.WithOwner(ctx)
				}
				rdb := b.NewClient(t)
				c := newClient(t, b, dsync.TTL(time.Second))
				s := c.Semaphore(name, 2)
				must(t, s.Acquire(ctx, 1))
				l1, err := s.Lease(ctx)
				must(t, err)
				k := semKeys(name)
				tm, err := rdb.Time(ctx).Result()
				must(t, err)
				holders, err := rdb.ZRange(ctx, k.Holders, 0, -1).Result()
				must(t, err)
				for _, h := range holders {
					must(t, rdb.ZAddXX(ctx, k.Holders, redis.Z{Score: float64(tm.Add(time.Minute).UnixMilli()), Member: h}).Err())
				}
				must(t, rdb.PExpire(ctx, k.State, time.Minute).Err())
				must(t, rdb.PExpire(ctx, k.Holders, time.Minute).Err())
				stall := make(chan struct{})
				dsync.SetRenewStall(c, func() { <-stall })
				waitDone(t, l1, 10*time.Second, "(renewals held back)")
				assertLeaseLost(t, l1)
				dsync.SetRenewStall(c, nil)
				close(stall)

				must(t, s.Acquire(ctx, 1))
				l2, err := s.Lease(ctx)
				must(t, err)
				if l2.Token() != l1.Token() {
					t.Skipf("the Acquire took a new holding (token %d, was %d)", l2.Token(), l1.Token())
				}
				if err := l2.Err(); err != nil {
					t.Fatalf("Lease right after the Acquire joined the holding: Err = %v, want nil (a live, renewed lease)", err)
				}
				time.Sleep(2 * time.Second) // two TTLs: renewed
				if err := l2.Err(); err != nil {
					t.Fatalf("Lease of the joined holding after two TTLs: Err = %v, want nil", err)
				}
				// Both permits are released, and nothing is left held.
				for i := 0; i < 2; i++ {
					if err := s.Release(ctx, 1); err != nil && !errors.Is(err, dsync.ErrLeaseLost) {
						t.Fatalf("Release %d: %v", i+1, err)
					}
				}
				waitDone(t, l2, time.Second, "after the last Release")
				if ok, err := newClient(t, b).Semaphore(name, 2).TryAcquire(context.Background(), 2); err != nil || !ok {
					t.Errorf("another holder's TryAcquire(2) after the Releases = %v, %v; want true", ok, err)
				}
				assertLeaseLost(t, l1)
			})
		})
	}
}
