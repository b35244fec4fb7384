package dsync_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A large Semaphore request queued behind holders is served before
// small-n newcomers (TryAcquire refused, Acquire queued behind it), also
// the holder that just released part and acquires again.
func TestSemaphoreLargeWaiterNotPassedBySmall(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		rdb := b.NewClient(t)
		hc := dsync.WithOwner(ctx)
		h := newClient(t, b).Semaphore(name, 3)
		must(t, h.Acquire(hc, 3))
		large := newClient(t, b).Semaphore(name, 3)
		lgot := async(func() error { return large.Acquire(ctx, 3) })
		waitFor(t, 10*time.Second, "the large waiter's place", func() bool {
			n, _ := rdb.ZCard(ctx, semKeys(name).Queue).Result()
			return n == 1
		})
		must(t, h.Release(hc, 1)) // 1 free: the large one does not fit
		small := newClient(t, b).Semaphore(name, 3)
		if ok, err := small.TryAcquire(ctx, 1); err != nil || ok {
			t.Fatalf("small TryAcquire passed the large waiter: %v %v", ok, err)
		}
		sgot := async(func() error { return small.Acquire(ctx, 1) })
		waitFor(t, 10*time.Second, "the small waiter's place", func() bool {
			n, _ := rdb.ZCard(ctx, semKeys(name).Queue).Result()
			return n == 2
		})
		hgot := async(func() error { return h.Acquire(hc, 1) }) // the holder again
		waitFor(t, 10*time.Second, "the holder's place", func() bool {
			n, _ := rdb.ZCard(ctx, semKeys(name).Queue).Result()
			return n == 3
		})
		select {
		case err := <-sgot:
			t.Fatalf("small served before the large waiter: %v", err)
		case err := <-hgot:
			t.Fatalf("holder served before the large waiter: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		must(t, h.Release(hc, 2))
		recvNil(t, lgot, 10*time.Second, "large waiter not served after the release")
		select {
		case err := <-sgot:
			t.Fatalf("small served while the large one holds all: %v", err)
		default:
		}
		must(t, large.Release(ctx, 3))
		recvNil(t, sgot, 10*time.Second, "small waiter not served")
		recvNil(t, hgot, 10*time.Second, "holder not served")
		must(t, small.Release(ctx, 1))
		must(t, h.Release(hc, 1))
	})
}
