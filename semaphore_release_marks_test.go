package dsync_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// A copy of a Release that named its holding and did not end it (a
// release of more permits than held, refused; or one that lowered the
// holding) arrives after an Acquire of the same owner joined the holding,
// which keeps its fencing token: the copy must change nothing. The release
// script skips looking up its call id for a release of a holding that no
// release lowered or refused; these are the releases that must not be
// taken for one.
func TestSemaphoreReleaseCopyAfterAJoinChangesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		for _, c := range []struct {
			name       string
			take, rel  int64
			wantCode   int64
			heldBefore int64 // after the release, before the join
		}{
			{"refused: more than held", 1, 2, 2, 1},
			{"lowered", 3, 1, 1, 2},
		} {
			t.Run(c.name, func(t *testing.T) {
				r := newReplayRig(t, b)
				const size = 4
				s := r.c.Semaphore(r.name, size)
				held := func() int64 {
					n, _ := r.rdb.HGet(context.Background(), semKeys(r.name).State, dsync.OwnerToken(r.ctx)).Int64()
					return n
				}
				must(t, s.Acquire(r.ctx, c.take))
				args := r.recordErr(t, lua.Script("semaphore_release"), func(ctx context.Context) error {
					return s.Release(ctx, c.rel)
				})
				if got := held(); got != c.heldBefore {
					t.Fatalf("permits held after the Release = %d, want %d", got, c.heldBefore)
				}
				// The join: the holding grows, its token stays.
				must(t, s.Acquire(r.ctx, 1))
				want := c.heldBefore + 1
				if got := held(); got != want {
					t.Fatalf("permits held after the join = %d, want %d", got, want)
				}
				if got := code(r.send(t, args)); got != c.wantCode {
					t.Errorf("copy of the Release replied %d, want %d as the first time", got, c.wantCode)
				}
				if got := held(); got != want {
					t.Fatalf("permits held after the copy = %d, want %d: the copy released permits", got, want)
				}
				must(t, s.Release(r.ctx, want))
				assertNoSemKeys(t, b, r.name)
			})
		}
	})
}

// The state hash's mark that someone is queued (':q') is gone (removed by
// hand: foreign interference) while a call waits: the release that frees
// the permits skips the queue and hands nothing over, and the waiter is
// served all the same by its own next attempt, within its wait (at most
// half its TTL of 1 s here), not left waiting for good.
func TestSemaphoreWaiterServedWithoutTheQueuedMark(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		ctx, name := ctxT(t), redistest.Key(t)
		rdb := b.NewClient(t)
		k := semKeys(name)
		holder := newClient(t, b).Semaphore(name, 1, dsync.TTL(time.Second))
		waiter := newClient(t, b).Semaphore(name, 1, dsync.TTL(time.Second))
		must(t, holder.Acquire(ctx, 1))
		got := make(chan error, 1)
		go func() { got <- waiter.Acquire(ctx, 1) }()
		waitFor(t, 5*time.Second, "the waiter to queue", func() bool {
			n, _ := rdb.ZCard(ctx, k.Queue).Result()
			return n == 1
		})
		if q, err := rdb.HGet(ctx, k.State, ":q").Result(); err != nil || q == "" {
			t.Fatalf("queued mark = %q, %v; want it set while a call is queued", q, err)
		}
		must(t, rdb.HDel(ctx, k.State, ":q").Err())
		must(t, holder.Release(ctx, 1))
		select {
		case err := <-got:
			must(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter was not served 10 s after the release (its wait is at most 0.5 s)")
		}
		must(t, waiter.Release(ctx, 1))
		assertNoSemKeys(t, b, name)
	})
}
