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
	// hold is the hold taken for an owner and renewed; other is another
	// owner's conflicting hold, tried.
	hold, other holdKind
	// keys are the keys that hold the hold, deleted behind it.
	keys func(n string) []string
}

var renewedHolds = []renewedHold{
	{"Mutex", mutexHold, mutexHold, func(n string) []string { return []string{mutexKeys(n).Lock} }},
	{"RWMutex.Lock", writeHold, writeHold, func(n string) []string { return []string{rwk(n).Writer} }},
	{"RWMutex.RLock", readHold, writeHold, func(n string) []string { return []string{rwk(n).Readers, rwk(n).ReaderData} }},
	{"Semaphore", semHold(1, 1), semHold(1, 1), func(n string) []string { return []string{semKeys(n).State, semKeys(n).Holders} }},
}

// take takes h for ctx's owner and returns its lease.
func take(t *testing.T, ctx context.Context, h holdCalls) *dsync.Lease {
	t.Helper()
	must(t, h.lock(ctx))
	l, err := h.lease(ctx)
	must(t, err)
	return l
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
			eachName(t, func(t *testing.T, b redistest.Backend, ctx context.Context, name string) {
				rdb := b.NewClient(t)
				octx := dsync.WithOwner(ctx)
				// Renewed every 333 ms.
				a := p.hold(newClient(t, b, dsync.TTL(time.Second)), name)
				la := take(t, octx, a)
				must(t, rdb.Del(ctx, p.keys(name)...).Err())
				other := p.other(newClient(t, b), name)
				if ok, err := other.try(ctx); !ok || err != nil {
					t.Fatalf("another owner's try after the loss = %v, %v; want true", ok, err)
				}
				must(t, other.unlock(ctx))
				bctx := dsync.WithOwnerToken(ctx, dsync.OwnerToken(octx))
				bh := p.hold(newClient(t, b), name)
				lb := take(t, bctx, bh)
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
				checkIs(t, a.unlock(octx), dsync.ErrLeaseLost, "A's release = %v, want ErrLeaseLost")
				if err := bh.unlock(bctx); err != nil {
					t.Errorf("B's release = %v", err)
				}
			})
		})
	}
}
