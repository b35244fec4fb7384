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

// A holder (a handle, or ctx's owner) holds 2 permits (holding F) whose
// lease was reported lost (the Client's renewals held back past the TTL)
// while Redis kept F; a Release(1) of the holder is in flight when an
// Acquire(1) of the holder joins F (the Release's script ran first, or the
// Acquire's did), and the Release's reply then comes or is lost. The
// Acquire's permit is held in Redis, so its nil must come with a live
// Lease, renewed: F is held in Redis past the deadline it had when the
// Acquire joined it. The holder counts the permits Redis holds: a
// Release(2) of them, its reply lost, ends F, and its repeat returns nil
// (the Release godoc), leaving the holder holding nothing, and owing
// nothing: its next Acquire(1) and Release(1) leave nothing held.
func TestSemaphoreAcquireIntoALostHoldingDuringARelease(t *testing.T) {
	testAcquireIntoALostHoldingDuringARelease(t, false)
}

// The owner's counterpart of
// TestSemaphoreAcquireIntoALostHoldingDuringARelease.
func TestSemaphoreOwnerAcquireIntoALostHoldingDuringARelease(t *testing.T) {
	testAcquireIntoALostHoldingDuringARelease(t, true)
}

func testAcquireIntoALostHoldingDuringARelease(t *testing.T, owned bool) {
	variants := []struct {
		name           string
		acquireFirst   bool // the Acquire's script runs before the Release's
		releaseReplied bool // the Release's reply comes (else it is lost)
	}{
		{"release-first", false, true},
		{"acquire-first", true, true},
		{"release-first-reply-lost", false, false},
	}
	eachRealName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		for _, v := range variants {
			name := name + "-" + v.name
			t.Run(v.name, func(t *testing.T) {
				octx := ctx
				if owned {
					octx = dsync.WithOwner(ctx)
				}
				hk := newOnceHook()
				c, _ := hookedClient(t, b, hk, dsync.TTL(time.Second))
				rdb := b.NewClient(t)
				k := semKeys(name)
				s := c.Semaphore(name, 4)
				must(t, s.Acquire(octx, 1))
				must(t, s.Release(octx, 1)) // the scripts loaded
				must(t, s.Acquire(octx, 2)) // F
				l1, err := s.Lease(octx)
				must(t, err)

				// Redis keeps F 3 s; the Client reports it lost after its
				// 1 s TTL.
				tm, err := rdb.Time(ctx).Result()
				must(t, err)
				keep := tm.Add(3 * time.Second)
				holders, err := rdb.ZRange(ctx, k.Holders, 0, -1).Result()
				must(t, err)
				for _, h := range holders {
					must(t, rdb.ZAddXX(ctx, k.Holders, redis.Z{Score: float64(keep.UnixMilli()), Member: h}).Err())
				}
				must(t, rdb.PExpire(ctx, k.State, 3*time.Second).Err())
				must(t, rdb.PExpire(ctx, k.Holders, 3*time.Second).Err())
				stall := make(chan struct{})
				dsync.SetRenewStall(c, func() { <-stall })
				waitDone(t, l1, 10*time.Second, "(renewals held back)")
				assertLeaseLost(t, l1)
				dsync.SetRenewStall(c, nil)
				close(stall)

				// The Release(1), held before or after its script runs.
				entered, ran, open := make(chan struct{}), make(chan struct{}), make(chan struct{})
				t.Cleanup(func() {
					select {
					case <-open:
					default:
						close(open)
					}
				})
				hk.on("semaphore_release", func(run func() error) error {
					close(entered)
					if v.acquireFirst {
						<-open
					}
					err := run()
					close(ran)
					if !v.acquireFirst {
						<-open
					}
					if !v.releaseReplied {
						return errors.New("i/o timeout")
					}
					return err
				})
				rIn := async(func() error { return s.Release(octx, 1) })
				<-entered
				if !v.acquireFirst {
					<-ran
				}
				must(t, s.Acquire(octx, 1)) // joins F
				l2, err := s.Lease(octx)
				must(t, err)
				if l2.Token() != l1.Token() {
					t.Fatalf("the Acquire took a new holding (token %d), want F's (%d)", l2.Token(), l1.Token())
				}
				if err := l2.Err(); err != nil {
					t.Errorf("Lease right after the Acquire joined F (Redis holds its permit): Err = %v, want nil", err)
				}
				close(open)
				<-ran
				err = recvErr(t, rIn, "the Release")
				switch {
				case v.releaseReplied && err != nil && !errors.Is(err, dsync.ErrLeaseLost):
					t.Fatalf("the Release(1) = %v, want nil or ErrLeaseLost", err)
				case !v.releaseReplied && err == nil:
					t.Fatal("the Release(1) whose reply was lost returned nil")
				}
				if used, _ := semHeld(t, rdb, name); used != 2 {
					t.Fatalf("Redis holds %d permits after the Release(1) and the Acquire(1), want 2", used)
				}

				// Past the deadline Redis had for F: renewed.
				tm, err = rdb.Time(ctx).Result()
				must(t, err)
				time.Sleep(keep.Sub(tm) + 1500*time.Millisecond)
				if used, _ := semHeld(t, rdb, name); used != 2 {
					t.Errorf("%d permits held in Redis 1.5 s past F's deadline when the Acquire joined it, want 2 (renewed)", used)
				}
				if err := l2.Err(); err != nil {
					t.Errorf("the joined holding's Lease past F's old deadline: Err = %v, want nil", err)
				}

				// The holder counts the 2 permits Redis holds: a Release(2)
				// whose reply is lost is of all of them, and its repeat
				// returns nil (Release godoc).
				hk.on("semaphore_release", func(run func() error) error {
					_ = run()
					return errors.New("i/o timeout")
				})
				if err := s.Release(octx, 2); err == nil {
					t.Fatal("the Release(2) whose reply was lost returned nil")
				}
				if used, holders := semHeld(t, rdb, name); used != 0 || holders != 0 {
					t.Errorf("%d permits in use by %d holders after the Release(2), want none", used, holders)
				}
				if err := s.Release(octx, 2); err != nil {
					t.Errorf("the Release(2) repeated = %v, want nil (the first released every permit the holder holds)", err)
				}
				if _, err := s.Lease(octx); !errors.Is(err, dsync.ErrNotHeld) {
					t.Errorf("Lease after the holder released all Redis held = %v, want ErrNotHeld", err)
				}
				assertLeaseLost(t, l1)

				// Nothing owed: the holder's next holding ends with its
				// own Release.
				must(t, s.Acquire(octx, 1))
				if err := s.Release(octx, 1); err != nil {
					t.Errorf("the Release(1) of a fresh holding = %v, want nil", err)
				}
				if used, holders := semHeld(t, rdb, name); used != 0 || holders != 0 {
					t.Errorf("%d permits in use by %d holders after the fresh holding's Release(1), want none", used, holders)
				}
				if _, err := s.Lease(octx); !errors.Is(err, dsync.ErrNotHeld) {
					t.Errorf("Lease after the fresh holding's Release(1) = %v, want ErrNotHeld", err)
				}
			})
		}
	})
}

// A holder's Release(1) of its 1 permit (A's) whose reply is lost, while
// an Acquire(1) of another goroutine (B) for the same holder joins the
// holding (the Release's script runs after it, lowering the holding) or
// takes a fresh one (the Release's script ran first, ending the holding).
// A then repeats its Release. It cannot be told from B's own Release(1):
// as the Release godoc says, it is a Release of the permit held, B's,
// and returns nil; B's Release then finds none (ErrNotHeld). Redis holds
// what the holder counts throughout: nothing at the end. Without an owner
// (the handle) and with one.
func TestSemaphoreRepeatAfterAnAcquireReleasesItsPermits(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		for _, owned := range []bool{false, true} {
			for _, joined := range []bool{true, false} {
				testRepeatAfterAnAcquire(t, b, ctx, fmt.Sprintf("%s-%v-%v", name, owned, joined), owned, joined)
			}
		}
	})
}

func testRepeatAfterAnAcquire(t *testing.T, b redistest.Backend, ctx context.Context, name string, owned, joined bool) {
	t.Helper()
	if owned {
		ctx = dsync.WithOwner(ctx)
	}
	what := fmt.Sprintf("owned %v, joined %v", owned, joined)
	hk := newOnceHook()
	c, _ := hookedClient(t, b, hk)
	rdb := b.NewClient(t)
	s := c.Semaphore(name, 2)
	must(t, s.Acquire(ctx, 1))
	must(t, s.Release(ctx, 1)) // the scripts loaded
	must(t, s.Acquire(ctx, 1)) // A's
	l, err := s.Lease(ctx)
	must(t, err)

	entered, open := make(chan struct{}), make(chan struct{})
	hk.on("semaphore_release", func(run func() error) error {
		close(entered)
		if joined {
			<-open
		}
		_ = run()
		return errors.New("i/o timeout")
	})
	aIn := async(func() error { return s.Release(ctx, 1) })
	<-entered
	if !joined {
		if err := recvErr(t, aIn, "A's Release"); err == nil {
			t.Fatalf("%s: A's Release with its reply lost = nil", what)
		}
	}
	must(t, s.Acquire(ctx, 1)) // B's
	lb, err := s.Lease(ctx)
	must(t, err)
	if joined {
		if lb.Token() != l.Token() {
			t.Fatalf("%s: B's Acquire took a fresh holding, want it to join A's", what)
		}
		close(open)
		if err := recvErr(t, aIn, "A's Release"); err == nil {
			t.Fatalf("%s: A's Release with its reply lost = nil", what)
		}
	} else if lb.Token() == l.Token() {
		t.Fatalf("%s: B's Acquire joined A's holding, which A's Release ended", what)
	}
	if used, _ := semHeld(t, rdb, name); used != 1 {
		t.Fatalf("%s: Redis holds %d permits after A's Release ran and B's Acquire, want 1", what, used)
	}

	if err := s.Release(ctx, 1); err != nil {
		t.Errorf("%s: A's repeated Release = %v, want nil", what, err)
	}
	if used, holders := semHeld(t, rdb, name); used != 0 || holders != 0 {
		t.Errorf("%s: %d permits in use by %d holders after the repeat, want none (it releases the permit held)", what, used, holders)
	}
	if err := s.Release(ctx, 1); !errors.Is(err, dsync.ErrNotHeld) {
		t.Errorf("%s: B's Release after the repeat = %v, want ErrNotHeld", what, err)
	}
	if _, err := s.Lease(ctx); !errors.Is(err, dsync.ErrNotHeld) {
		t.Errorf("%s: Lease at the end = %v, want ErrNotHeld", what, err)
	}
	// The holder acquires and releases as before.
	must(t, s.Acquire(ctx, 2))
	must(t, s.Release(ctx, 2))
	if used, holders := semHeld(t, rdb, name); used != 0 || holders != 0 {
		t.Errorf("%s: %d permits in use by %d holders at the end, want none", what, used, holders)
	}
}

// A Release of every permit of a holding whose outcome is unknown (its
// script not run yet: its first copy is on its way), then an Acquire of
// the same holder that joins the holding (the same fencing token: the
// Release had not ended it), the Release's copy delivered after it,
// lowering the joined holding, and the holding lost (its keys deleted):
// the next Release finds nothing and returns ErrLeaseLost, and the Lease
// reports the loss. Joined, the first Release was of only some of the
// holding's permits, and a repeat of it tells only that it ran, not that
// it ended the holding; taken for one that ended it, the Release returned
// nil and the Lease ended released, though the joined permit was lost.
// With and without an owner.
func TestSemaphoreUnknownReleaseThenJoinThenLossIsReported(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		for _, owned := range []bool{false, true} {
			t.Run(fmt.Sprintf("owned=%v", owned), func(t *testing.T) {
				name := fmt.Sprintf("%s-%v", name, owned)
				rec := &redistest.Recorder{}
				c, rdb := hookedClient(t, b, rec)
				rel := scriptFaults("semaphore_release")
				rdb.AddHook(rel)
				cctx := ctx
				if owned {
					cctx = dsync.WithOwner(ctx)
				}
				s := c.Semaphore(name, 3)
				must(t, s.Acquire(cctx, 1))
				must(t, s.Release(cctx, 1)) // the script is loaded
				must(t, s.Acquire(cctx, 1))
				rec.Reset()
				rel.FailNext(1, errors.New("i/o timeout"))
				if err := s.Release(cctx, 1); err == nil {
					t.Fatal("the Release whose copy is held back = nil, want an error")
				}
				args := lastRun(t, rec, "semaphore_release", "")
				must(t, s.Acquire(cctx, 1)) // joins the holding
				l, err := s.Lease(cctx)
				must(t, err)
				if err := rdb.Do(ctx, args...).Err(); err != nil {
					t.Fatalf("the first copy of the Release, delivered late: %v", err)
				}
				if used, _ := semHeld(t, rdb, name); used != 1 {
					t.Fatalf("%d permits in use after the late copy, want 1", used)
				}
				ks := semKeys(name)
				must(t, rdb.Del(ctx, ks.State, ks.Holders).Err())
				if err := s.Release(cctx, 1); !errors.Is(err, dsync.ErrLeaseLost) {
					t.Errorf("the Release of the lost holding's permit = %v, want ErrLeaseLost", err)
				}
				waitDone(t, l, 5*time.Second, "the lost holding's lease")
				if err := l.Err(); !errors.Is(err, dsync.ErrLeaseLost) {
					t.Errorf("the lost holding's Lease.Err = %v, want ErrLeaseLost", err)
				}
			})
		}
	})
}
