package dsync_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A Semaphore holding whose lease ran out is over, however many other
// holdings ran out with it: when its owner acquires again, that is a fresh
// holding, whose fencing token is above every earlier one (DESIGN,
// Fencing). Here 250 holders die at once (their Client's renewer stalls),
// more than one script drops; a live holder keeps the holders zset; the
// owner whose lease ran out last acquires again after another owner took a
// fresh holding. (Its lost holding, not yet dropped, was taken up again,
// with its old token, below the other owner's.)
func TestSemaphoreFreshHoldingAfterManyLeasesRanOut(t *testing.T) {
	eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
		if b.Mini != nil {
			b.Mini.ClockTTL(true) // TTLs run down with TIME, as on a server
		}
		const dead, size = 250, 1000
		rdb := b.NewClient(t)
		// The dying holders: their Client stops renewing once they hold.
		dc := newClient(t, b, dsync.TTL(time.Second))
		stall := make(chan struct{})
		var stallOnce sync.Once
		unstall := func() { stallOnce.Do(func() { close(stall) }) }
		t.Cleanup(unstall)
		var wg sync.WaitGroup
		errs := make(chan error, dead)
		for i := 0; i < dead; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				octx := dsync.WithOwnerToken(ctx, fmt.Sprintf("dead-%03d", i))
				errs <- dc.Semaphore(name, size).Acquire(octx, 1)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			must(t, err)
		}
		dsync.SetRenewStall(dc, func() { <-stall })

		// A live holder keeps the holders zset alive.
		cc := newClient(t, b)
		cctx := dsync.WithOwnerToken(ctx, "owner-c")
		must(t, cc.Semaphore(name, size).Acquire(cctx, 1))

		// The owner whose holding runs out last: a fixed lease, taken
		// after the others stopped being renewed.
		ac := newClient(t, b, dsync.TTL(2*time.Second), dsync.FixedLease())
		actx := dsync.WithOwnerToken(ctx, "owner-a")
		sa := ac.Semaphore(name, size)
		must(t, sa.Acquire(actx, 1))
		la, err := sa.Lease(actx)
		must(t, err)
		first := la.Token()
		select {
		case <-la.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the fixed lease did not end")
		}
		// By server time too.
		dl, err := rdb.ZScore(ctx, semKeys(name).Holders, "owner-a").Result()
		must(t, err)
		waitFor(t, 10*time.Second, "the server's time past the lease", func() bool {
			return rsNow(t, rdb).UnixMilli() > int64(dl)
		})
		if n, err := rdb.ZCount(ctx, semKeys(name).Holders, "-inf", fmt.Sprint(dl)).Result(); err != nil || n <= 200 {
			t.Fatalf("%d holdings ran out (%v), want more than two scripts drop", n, err)
		}

		// Another owner takes a fresh holding.
		bc := newClient(t, b)
		bctx := dsync.WithOwnerToken(ctx, "owner-b")
		sb := bc.Semaphore(name, size)
		must(t, sb.Acquire(bctx, 1))
		lb, err := sb.Lease(bctx)
		must(t, err)
		if lb.Token() <= first {
			t.Fatalf("B's token %d, want above A's earlier %d", lb.Token(), first)
		}

		// A again: a fresh holding.
		a2 := ac.Semaphore(name, size)
		must(t, a2.Acquire(actx, 1))
		la2, err := a2.Lease(actx)
		must(t, err)
		if la2.Token() <= lb.Token() {
			t.Errorf("A's fresh holding has token %d (its lost one had %d), want above B's %d", la2.Token(), first, lb.Token())
		}
		must(t, a2.Release(actx, 1))
		must(t, sb.Release(bctx, 1))
		unstall()
	})
}
