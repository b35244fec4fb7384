package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
)

// Many goroutines Acquire and Release through one handle (no owner) while
// another client competes; at the end nothing is left held in Redis.
func TestSemaphoreOneHandleStress(t *testing.T) {
	b, ctx, name := realName(t)
	const size = 4
	c := newClient(t, b)
	s := c.Semaphore(name, size)
	other := newClient(t, b).Semaphore(name, size)
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				n := int64(1 + rand.IntN(2))
				if rand.IntN(3) == 0 {
					ok, err := s.TryAcquire(ctx, n)
					if err != nil {
						errs <- err
						return
					}
					if !ok {
						continue
					}
				} else if err := s.Acquire(ctx, n); err != nil {
					errs <- fmt.Errorf("Acquire(%d): %w", n, err)
					return
				}
				if _, err := s.Lease(ctx); err != nil {
					errs <- fmt.Errorf("Lease: %w", err)
				}
				if err := s.Release(ctx, n); err != nil {
					errs <- fmt.Errorf("Release(%d): %w", n, err)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 30; i++ {
			n := int64(1 + rand.IntN(size))
			if err := other.Acquire(ctx, n); err != nil {
				errs <- err
				return
			}
			must(t, other.Release(ctx, n))
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	dsync.WaitCleanups(c)
	rdb := b.NewClient(t)
	st, _ := rdb.HGetAll(ctx, semKeys(name).State).Result()
	if len(st) != 0 {
		t.Errorf("state left: %v", st)
	}
	tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	must(t, newClient(t, b).Semaphore(name, size).Acquire(tctx, size))
}

// A handle without owner: call A holds 1 permit (holding F1); call B's 2
// permits join F1 in Redis, B's reply late. F1 is lost (its keys deleted
// behind the holder's back); call C takes a fresh holding F2. B's reply
// then arrives: B's Acquire returns nil, so its 2 permits, lost with F1,
// are the handle's to settle, as A's are. Releases settle them first
// (ErrLeaseLost) and must never release for them C's permit in F2
// (Semaphore.Release godoc): B's Release(2) leaves F2 held in Redis.
func TestSemaphoreLateGrantIntoLostHoldingIsOwed(t *testing.T) {
	b, ctx, name := realName(t)
	hk := newOnceHook()
	c, _ := hookedClient(t, b, hk)
	s := c.Semaphore(name, 4)
	rdb := b.NewClient(t)
	k := semKeys(name)

	must(t, s.Acquire(ctx, 1)) // A: F1; the script loaded
	ran, release := hk.holdReply(t, "semaphore_acquire")
	bIn := async(func() error { return s.Acquire(ctx, 2) }) // B joins F1
	ran("B's acquire")
	if n, _ := rdb.HGet(ctx, k.State, ":used").Int(); n != 3 {
		t.Fatalf(":used = %d after B joined F1, want 3", n)
	}
	must(t, rdb.Del(ctx, k.State, k.Holders).Err()) // F1 lost
	must(t, s.Acquire(ctx, 1))                      // C: a fresh holding F2
	lc, err := s.Lease(ctx)
	must(t, err)
	release()
	must(t, recvErr(t, bIn, "B"))

	// B gives its 2 permits back: they were lost with F1.
	mustIs(t, s.Release(ctx, 2), dsync.ErrLeaseLost, "B's Release(2) = %v, want ErrLeaseLost")
	if n, _ := rdb.HGet(ctx, k.State, ":used").Int(); n != 1 {
		t.Fatalf("after B's Release, Redis holds %d permits, want 1: C's permit in F2 was released for B's lost ones", n)
	}
	if err := lc.Err(); err != nil {
		t.Errorf("C's Lease: %v, want live", err)
	}
	// A's lost permit is settled too; C's Release then ends F2.
	mustIs(t, s.Release(ctx, 1), dsync.ErrLeaseLost, "A's Release(1) = %v, want ErrLeaseLost")
	if err := s.Release(ctx, 1); err != nil && !errors.Is(err, dsync.ErrLeaseLost) {
		t.Fatalf("C's Release(1) = %v", err)
	}
	if n, _ := rdb.Exists(ctx, k.State, k.Holders).Result(); n != 0 {
		t.Errorf("keys left after every permit was released: %d", n)
	}
}

// As TestSemaphoreLateGrantIntoLostHoldingIsOwed, but before B's reply
// arrives the handle's next holding F2 is released (the handle's last
// ended holding is then later than F1) and call D takes F3 with 2
// permits: B's Release(2) must settle B's lost permits, not end D's.
func TestSemaphoreLateGrantIntoLostHoldingAfterARelease(t *testing.T) {
	b, ctx, name := realName(t)
	hk := newOnceHook()
	c, _ := hookedClient(t, b, hk)
	s := c.Semaphore(name, 4)
	rdb := b.NewClient(t)
	k := semKeys(name)

	must(t, s.Acquire(ctx, 1)) // A: F1; the script loaded
	must(t, s.Release(ctx, 1))
	must(t, s.Acquire(ctx, 1))
	ran, release := hk.holdReply(t, "semaphore_acquire")
	bIn := async(func() error { return s.Acquire(ctx, 2) }) // B joins F1
	ran("B's acquire")
	must(t, rdb.Del(ctx, k.State, k.Holders).Err()) // F1 lost
	must(t, s.Acquire(ctx, 1))                      // C: F2
	mustIs(t, s.Release(ctx, 1), dsync.ErrLeaseLost, "A's Release(1) = %v, want ErrLeaseLost")
	must(t, s.Release(ctx, 1)) // C's: F2 ends
	must(t, s.Acquire(ctx, 2)) // D: F3
	release()
	must(t, recvErr(t, bIn, "B"))

	mustIs(t, s.Release(ctx, 2), dsync.ErrLeaseLost, "B's Release(2) = %v, want ErrLeaseLost")
	if n, _ := rdb.HGet(ctx, k.State, ":used").Int(); n != 2 {
		t.Fatalf("after B's Release, Redis holds %d permits, want 2: D's permits in F3 were released for B's lost ones", n)
	}
	must(t, s.Release(ctx, 2)) // D's
	if n, _ := rdb.Exists(ctx, k.State, k.Holders).Result(); n != 0 {
		t.Errorf("keys left after every permit was released: %d", n)
	}
}

// A handle holds 3 permits (F1); a Release(1) of it gets no reply (it
// was applied: 2 held in Redis). F1 is then lost, and a later Acquire
// takes F2. "Permits of a holding that a Release with an unknown outcome
// was sent for are not owed" (Release godoc): the handle owes F1's 2
// other permits, not 3. After Releases of those 2 (ErrLeaseLost) and of
// F2's permit, nothing is held in Redis.
func TestSemaphoreUnknownPartialReleaseNotOwed(t *testing.T) {
	b, ctx, name := realName(t)
	rel := scriptFaults("semaphore_release")
	c, rdb0 := hookedClient(t, b, rel)
	_ = rdb0
	s := c.Semaphore(name, 4)
	rdb := b.NewClient(t)
	k := semKeys(name)

	must(t, s.Acquire(ctx, 1)) // the scripts loaded
	must(t, s.Release(ctx, 1))
	must(t, s.Acquire(ctx, 3)) // F1
	rel.DropReplyNext(1, errors.New("i/o timeout"))
	if err := s.Release(ctx, 1); err == nil {
		t.Fatal("the Release whose reply was lost returned nil")
	}
	if n, _ := rdb.HGet(ctx, k.State, ":used").Int(); n != 2 {
		t.Fatalf(":used = %d, want 2 (the Release applied)", n)
	}
	must(t, rdb.Del(ctx, k.State, k.Holders).Err()) // F1 lost
	must(t, s.Acquire(ctx, 1))                      // F2
	mustIs(t, s.Release(ctx, 2), dsync.ErrLeaseLost, "Release(2) of F1's rest = %v, want ErrLeaseLost")
	if err := s.Release(ctx, 1); err != nil {
		t.Errorf("Release(1) of F2's permit = %v, want nil", err)
	}
	if n, _ := rdb.Exists(ctx, k.State, k.Holders).Result(); n != 0 {
		t.Errorf("F2 still held in Redis after every permit was released (renewed by the handle: leaked)")
	}
}

// Both findings at once: B's 2 permits join F1 (reply late); a Release(3)
// through the handle (which knows 1) ends F1, its reply lost; C takes F2;
// B's reply comes. Neither F1's permit (the Release was sent for it) nor
// B's late ones (that Release may have ended them) are owed: C's Release
// of its own permit releases it, and nothing is left held. (On main the
// Release(3), not "whole", leaves F1's permit owed.)
func TestSemaphoreLateGrantIntoUnsurelyReleasedHoldingNotOwed(t *testing.T) {
	b, ctx, name := realName(t)
	hk := newOnceHook()
	rel := scriptFaults("semaphore_release")
	c, rdb0 := hookedClient(t, b, hk)
	rdb0.AddHook(rel)
	s := c.Semaphore(name, 4)
	rdb := b.NewClient(t)
	k := semKeys(name)

	must(t, s.Acquire(ctx, 1)) // the scripts loaded
	must(t, s.Release(ctx, 1))
	must(t, s.Acquire(ctx, 1)) // A: F1
	ran, release := hk.holdReply(t, "semaphore_acquire")
	bIn := async(func() error { return s.Acquire(ctx, 2) }) // B joins F1
	ran("B's acquire")
	rel.DropReplyNext(1, errors.New("i/o timeout"))
	if err := s.Release(ctx, 3); err == nil {
		t.Fatal("the Release whose reply was lost returned nil")
	}
	if n, _ := rdb.Exists(ctx, k.State).Result(); n != 0 {
		t.Fatalf("the Release did not end F1")
	}
	must(t, s.Acquire(ctx, 1)) // C: F2
	release()
	must(t, recvErr(t, bIn, "B"))
	if err := s.Release(ctx, 1); err != nil {
		t.Fatalf("C's Release(1) = %v, want nil", err)
	}
	if n, _ := rdb.Exists(ctx, k.State, k.Holders).Result(); n != 0 {
		t.Errorf("keys left after C's Release: %d (F2 still held)", n)
	}
}
