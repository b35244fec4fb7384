package dsync_test

import (
	"context"
	"testing"

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
