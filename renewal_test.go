package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// renewedHold is a hold of one primitive for TestRenewalNeverRevivesALostHold.
type renewedHold struct {
	name string
	// take takes the hold for ctx's owner through c and returns its
	// lease and its release.
	take func(ctx context.Context, c *dsync.Client, n string) (*dsync.Lease, func(context.Context) error, error)
	// try is another owner's attempt at a conflicting hold, and its release.
	try func(ctx context.Context, c *dsync.Client, n string) (bool, func(context.Context) error, error)
	// keys are the keys that hold the hold, deleted behind it.
	keys func(n string) []string
}

var renewedHolds = []renewedHold{
	{"Mutex",
		func(ctx context.Context, c *dsync.Client, n string) (*dsync.Lease, func(context.Context) error, error) {
			m := c.Mutex(n)
			if err := m.Lock(ctx); err != nil {
				return nil, nil, err
			}
			l, err := m.Lease(ctx)
			return l, m.Unlock, err
		},
		func(ctx context.Context, c *dsync.Client, n string) (bool, func(context.Context) error, error) {
			m := c.Mutex(n)
			ok, err := m.TryLock(ctx)
			return ok, m.Unlock, err
		},
		func(n string) []string { return []string{mutexKeys(n).Lock} }},
	{"RWMutex.Lock",
		func(ctx context.Context, c *dsync.Client, n string) (*dsync.Lease, func(context.Context) error, error) {
			rw := c.RWMutex(n)
			if err := rw.Lock(ctx); err != nil {
				return nil, nil, err
			}
			l, err := rw.Lease(ctx)
			return l, rw.Unlock, err
		},
		func(ctx context.Context, c *dsync.Client, n string) (bool, func(context.Context) error, error) {
			rw := c.RWMutex(n)
			ok, err := rw.TryLock(ctx)
			return ok, rw.Unlock, err
		},
		func(n string) []string { return []string{rwk(n).Writer} }},
	{"RWMutex.RLock",
		func(ctx context.Context, c *dsync.Client, n string) (*dsync.Lease, func(context.Context) error, error) {
			rw := c.RWMutex(n)
			if err := rw.RLock(ctx); err != nil {
				return nil, nil, err
			}
			l, err := rw.RLease(ctx)
			return l, rw.RUnlock, err
		},
		func(ctx context.Context, c *dsync.Client, n string) (bool, func(context.Context) error, error) {
			rw := c.RWMutex(n)
			ok, err := rw.TryLock(ctx)
			return ok, rw.Unlock, err
		},
		func(n string) []string { return []string{rwk(n).Readers, rwk(n).ReaderData} }},
	{"Semaphore",
		func(ctx context.Context, c *dsync.Client, n string) (*dsync.Lease, func(context.Context) error, error) {
			s := c.Semaphore(n, 1)
			if err := s.Acquire(ctx, 1); err != nil {
				return nil, nil, err
			}
			l, err := s.Lease(ctx)
			return l, func(ctx context.Context) error { return s.Release(ctx, 1) }, err
		},
		func(ctx context.Context, c *dsync.Client, n string) (bool, func(context.Context) error, error) {
			s := c.Semaphore(n, 1)
			ok, err := s.TryAcquire(ctx, 1)
			return ok, func(ctx context.Context) error { return s.Release(ctx, 1) }, err
		},
		func(n string) []string { return []string{semKeys(n).State, semKeys(n).Holders} }},
}

// TestRenewalNeverRevivesALostHold: process A holds for an owner; the hold
// is lost (its keys deleted behind it), another owner takes and releases
// the name, and then process B, carrying A's owner token, takes it afresh.
// A's renewer must report A's hold lost, not extend B's hold in its name:
// the owner is the same, the hold is not, and another owner was inside in
// between. Before, renewals named a hold by its owner alone: A's Lease
// stayed live (Err nil) for good, on every primitive, and A's renewer kept
// B's hold alive even if B died.
func TestRenewalNeverRevivesALostHold(t *testing.T) {
	for _, p := range renewedHolds {
		t.Run(p.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b redistest.Backend) {
				ctx := ctxT(t)
				name := redistest.Key(t)
				rdb := b.NewClient(t)
				octx := dsync.WithOwner(ctx)
				// Renewed every 333 ms.
				la, unlockA, err := p.take(octx, newClient(t, b, dsync.TTL(time.Second)), name)
				if err != nil {
					t.Fatal(err)
				}
				must(t, rdb.Del(ctx, p.keys(name)...).Err())
				ok, release, err := p.try(ctx, newClient(t, b), name)
				if !ok || err != nil {
					t.Fatalf("another owner's try after the loss = %v, %v; want true", ok, err)
				}
				must(t, release(ctx))
				bctx := dsync.WithOwnerToken(ctx, dsync.OwnerToken(octx))
				lb, unlockB, err := p.take(bctx, newClient(t, b), name)
				if err != nil {
					t.Fatal(err)
				}
				select {
				case <-la.Done():
					if !errors.Is(la.Err(), dsync.ErrLeaseLost) {
						t.Fatalf("A's lease ended with %v, want ErrLeaseLost", la.Err())
					}
				case <-time.After(3 * time.Second):
					t.Fatalf("A's lost hold still reported live 3 s later (Err %v), renewed as the owner's later hold", la.Err())
				}
				if lb.Err() != nil {
					t.Fatalf("B's lease = %v, want live", lb.Err())
				}
				if err := unlockA(octx); !errors.Is(err, dsync.ErrLeaseLost) {
					t.Errorf("A's release = %v, want ErrLeaseLost", err)
				}
				if err := unlockB(bctx); err != nil {
					t.Errorf("B's release = %v", err)
				}
			})
		})
	}
}
