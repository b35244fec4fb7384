package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// A holder as TestConcurrentUnlocksOfOneOwner drives it: take and
// release one level, and whether another owner can take the name.
type unlockCase struct {
	name    string
	take    func(ctx context.Context) error
	release func(ctx context.Context) error
	free    func(ctx context.Context) (bool, error)
	done    func(ctx context.Context) error // undoes free's hold
}

func unlockCases(c, other *dsync.Client, name string) []unlockCase {
	m, mo := c.Mutex(name+"m"), other.Mutex(name+"m")
	rw, rwo := c.RWMutex(name+"w"), other.RWMutex(name+"w")
	rr, rro := c.RWMutex(name+"r"), other.RWMutex(name+"r")
	s, so := c.Semaphore(name+"s", 2), other.Semaphore(name+"s", 2)
	return []unlockCase{
		{"Mutex", m.Lock, m.Unlock, mo.TryLock, mo.Unlock},
		{"RWMutex.Lock", rw.Lock, rw.Unlock, rwo.TryLock, rwo.Unlock},
		{"RWMutex.RLock", rr.RLock, rr.RUnlock, rro.TryLock, rro.Unlock},
		{"Semaphore", func(ctx context.Context) error { return s.Acquire(ctx, 1) },
			func(ctx context.Context) error { return s.Release(ctx, 1) },
			func(ctx context.Context) (bool, error) { return so.TryAcquire(ctx, 2) },
			func(ctx context.Context) error { return so.Release(ctx, 2) }},
	}
}

// Two goroutines of one owner release at once (one request fanning out):
// every level released is released once. Holding two levels, both
// releases return nil and the name is free; holding one, one returns nil,
// the other ErrNotHeld, and the name is free.
func TestConcurrentUnlocksOfOneOwner(t *testing.T) {
	eachBackend(t, func(t *testing.T, b redistest.Backend) {
		c, other := newClient(t, b), newClient(t, b)
		local := newClient(t, b, dsync.ClientReentrancy())
		concurrentUnlocks(t, func(name string) []unlockCase {
			cs := unlockCases(c, other, name)
			// Under client reentrancy (Mutex and RWMutex) the process
			// counts the levels.
			for _, tc := range unlockCases(local, other, name+"local")[:3] {
				tc.name += " (client reentrancy)"
				cs = append(cs, tc)
			}
			return cs
		})
	})
	t.Run("quorum", func(t *testing.T) {
		var rdbs []redis.UniversalClient
		for range 3 {
			rdbs = append(rdbs, redistest.Miniredis(t).NewClient(t))
		}
		q, other := newQuorum(t, rdbs), newQuorum(t, rdbs)
		concurrentUnlocks(t, func(name string) []unlockCase {
			m, mo := q.Mutex(name+"m"), other.Mutex(name+"m")
			rw, rwo := q.RWMutex(name+"w"), other.RWMutex(name+"w")
			rr, rro := q.RWMutex(name+"r"), other.RWMutex(name+"r")
			return []unlockCase{
				{"Quorum Mutex", m.Lock, m.Unlock, mo.TryLock, mo.Unlock},
				{"Quorum RWMutex.Lock", rw.Lock, rw.Unlock, rwo.TryLock, rwo.Unlock},
				{"Quorum RWMutex.RLock", rr.RLock, rr.RUnlock, rro.TryLock, rro.Unlock},
			}
		})
	})
}

func concurrentUnlocks(t *testing.T, cases func(name string) []unlockCase) {
	ctx := ctxT(t)
	for _, levels := range []int{2, 1} {
		for round := range 10 {
			name := fmt.Sprintf("%s-%d-%d", redistest.Key(t), levels, round)
			for _, tc := range cases(name) {
				own := dsync.WithOwner(ctx)
				for range levels {
					if err := tc.take(own); err != nil {
						t.Fatalf("%s: %v", tc.name, err)
					}
				}
				var wg sync.WaitGroup
				errs := make([]error, 2)
				for i := range errs {
					wg.Add(1)
					go func() { defer wg.Done(); errs[i] = tc.release(own) }()
				}
				wg.Wait()
				nils, notHeld := 0, 0
				for _, err := range errs {
					switch {
					case err == nil:
						nils++
					case errors.Is(err, dsync.ErrNotHeld):
						notHeld++
					}
				}
				if nils != levels || nils+notHeld != 2 {
					t.Errorf("%s, %d levels: two concurrent releases returned %v; want %d nil and the rest ErrNotHeld", tc.name, levels, errs, levels)
				}
				ok, err := tc.free(ctx)
				if err != nil || !ok {
					t.Errorf("%s, %d levels: after two concurrent releases another owner's try = %v, %v; want the name free", tc.name, levels, ok, err)
					continue
				}
				must(t, tc.done(ctx))
			}
		}
	}
}
