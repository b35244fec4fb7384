package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// semHeld returns the permits in use of the Semaphore called name, and its
// number of holders, as Redis has them.
func semHeld(t *testing.T, rdb redis.UniversalClient, name string) (used, holders int64) {
	t.Helper()
	ks := semKeys(name)
	u, err := rdb.HGet(context.Background(), ks.State, ":used").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	h, err := rdb.ZCard(context.Background(), ks.Holders).Result()
	must(t, err)
	return u, h
}

// A Release whose reply was lost (it released the holding) and that the
// caller repeats, as one does after an error of unknown outcome: the
// repeat answers nil, the holding's Lease ends released, not lost, and
// nothing is held. With and without an owner.
func TestSemaphoreReleaseRepeatedAfterALostReply(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rel := scriptFaults("semaphore_release")
		c, _ := hookedClient(t, b, rel)
		for _, owned := range []bool{false, true} {
			name := fmt.Sprintf("%s-%v", name, owned)
			cctx := ctx
			if owned {
				cctx = dsync.WithOwner(ctx)
			}
			s := c.Semaphore(name, 2)
			must(t, s.Acquire(cctx, 1))
			must(t, s.Release(cctx, 1)) // the script is loaded
			must(t, s.Acquire(cctx, 1))
			l, err := s.Lease(cctx)
			must(t, err)
			rel.DropReplyNext(1, errors.New("i/o timeout"))
			if err := s.Release(cctx, 1); err == nil {
				t.Fatalf("owned %v: Release with its reply lost = nil", owned)
			}
			if used, _ := semHeld(t, b.NewClient(t), name); used != 0 {
				t.Fatalf("owned %v: the Release whose reply was lost did not run: %d in use", owned, used)
			}
			if err := s.Release(cctx, 1); err != nil {
				t.Errorf("owned %v: the Release repeated = %v, want nil (the first released the holding)", owned, err)
			}
			if err := l.Err(); err != nil {
				t.Errorf("owned %v: the released holding's Lease.Err = %v, want nil", owned, err)
			}
			waitDone(t, l, 5*time.Second, "the released holding's lease")
			// The handle is free: a new holding is taken and released.
			must(t, s.Acquire(cctx, 2))
			must(t, s.Release(cctx, 2))
			if used, holders := semHeld(t, b.NewClient(t), name); used != 0 || holders != 0 {
				t.Errorf("owned %v: %d permits in use by %d holders at the end, want none", owned, used, holders)
			}
		}
	})
}

// A Release of a handle's holding whose reply was lost (it released the
// holding), not repeated: the permits it released are no debt of the
// handle. The handle's next holding is released by its Release, whether
// the Client noticed the first holding gone before the next Acquire (on
// the real servers, after the renewer's check) or only at it.
func TestSemaphoreReleaseWithALostReplyLeavesNoDebt(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		for _, wait := range []bool{false, true} {
			if wait && b.Mini != nil {
				continue // leases are not checked on miniredis
			}
			name := fmt.Sprintf("%s-%v", name, wait)
			rel := scriptFaults("semaphore_release")
			c, _ := hookedClient(t, b, rel, dsync.TTL(time.Second))
			s := c.Semaphore(name, 2)
			must(t, s.Acquire(ctx, 1))
			must(t, s.Release(ctx, 1)) // the script is loaded
			must(t, s.Acquire(ctx, 1))
			l, err := s.Lease(ctx)
			must(t, err)
			rel.DropReplyNext(1, errors.New("i/o timeout"))
			if err := s.Release(ctx, 1); err == nil {
				t.Fatal("Release with its reply lost = nil")
			}
			if wait {
				waitDone(t, l, 5*time.Second, "the first holding's lease")
			}
			must(t, s.Acquire(ctx, 1))
			if err := s.Release(ctx, 1); err != nil {
				t.Errorf("wait %v: Release of the next holding = %v, want nil", wait, err)
			}
			if used, holders := semHeld(t, b.NewClient(t), name); used != 0 || holders != 0 {
				t.Errorf("wait %v: %d permits in use by %d holders after the next holding's Release, want none", wait, used, holders)
			}
			if _, err := s.Lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
				t.Errorf("wait %v: Lease after the last Release = %v, want ErrNotHeld", wait, err)
			}
		}
	})
}

// A handle holding 2 permits (two workers' Acquire(1)); one worker's
// Release(1) loses its reply after releasing its permit. The other
// worker's Release(1) releases the other permit: it is no repeat of the
// first, whose outcome the first worker was told is unknown.
func TestSemaphoreReleaseAfterAnotherLostItsReply(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rel := scriptFaults("semaphore_release")
		c, _ := hookedClient(t, b, rel)
		s := c.Semaphore(name, 3)
		must(t, s.Acquire(ctx, 1))
		must(t, s.Release(ctx, 1)) // the script is loaded
		must(t, s.Acquire(ctx, 1))
		must(t, s.Acquire(ctx, 1))
		rel.DropReplyNext(1, errors.New("i/o timeout"))
		if err := s.Release(ctx, 1); err == nil {
			t.Fatal("Release with its reply lost = nil")
		}
		if used, _ := semHeld(t, b.NewClient(t), name); used != 1 {
			t.Fatalf("%d permits in use after the first Release, want 1", used)
		}
		must(t, s.Release(ctx, 1))
		if used, holders := semHeld(t, b.NewClient(t), name); used != 0 || holders != 0 {
			t.Errorf("%d permits in use by %d holders after the second worker's Release, want none", used, holders)
		}
	})
}

// A handle holds 2 permits; a Release(1) fails before its outcome is known
// (counted released: its permit is not owed), and a Release(1) of the rest
// succeeds, the server answering that 1 permit is left (the first Release
// never ran). The handle holds nothing it counts: it stops renewing the
// holding, and the permit left runs out at the holding's TTL (before, the
// Client renewed it for as long as it lived, and the Semaphore stayed a
// permit short).
func TestSemaphorePartialReleaseUnknownThenRestRunsOut(t *testing.T) {
	eachRealName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rel := scriptFaults("semaphore_release")
		c, _ := hookedClient(t, b, rel, dsync.TTL(time.Second))
		s := c.Semaphore(name, 2)
		must(t, s.Acquire(ctx, 1))
		must(t, s.Release(ctx, 1)) // the script loaded
		must(t, s.Acquire(ctx, 2))
		rel.FailNext(1, errors.New("i/o timeout"))
		if err := s.Release(ctx, 1); err == nil {
			t.Fatal("a Release(1) whose command failed returned nil")
		}
		must(t, s.Release(ctx, 1))
		if used, _ := semHeld(t, b.NewClient(t), name); used != 1 {
			t.Fatalf("%d permits in use after the second Release, want the 1 the failed Release did not release", used)
		}
		time.Sleep(3 * time.Second) // 3 TTLs
		if used, holders := semHeld(t, b.NewClient(t), name); used != 0 {
			t.Errorf("3 TTLs after the handle released all it counts: %d permits in use by %d holders (renewed by the Client)", used, holders)
		}
		o := newClient(t, b).Semaphore(name, 2)
		ok, err := o.TryAcquire(ctx, 2)
		if err != nil || !ok {
			t.Fatalf("another Client's TryAcquire(2) = %v, %v; want true", ok, err)
		}
		must(t, o.Release(ctx, 2))
		// The handle acquires and releases as before.
		must(t, s.Acquire(ctx, 2))
		must(t, s.Release(ctx, 2))
		if used, _ := semHeld(t, b.NewClient(t), name); used != 0 {
			t.Errorf("%d permits in use after the handle's Acquire(2) and Release(2)", used)
		}
	})
}
