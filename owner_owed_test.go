package dsync_test

import (
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// An owner used by two goroutines holds two levels of a hold that is then
// lost (its key deleted, which the renewer finds). One goroutine's Unlock
// gets ErrLeaseLost and its Lock takes a fresh hold; the other goroutine's
// Unlock, of its level of the lost hold, gets ErrLeaseLost too and never
// ends that fresh hold, whose lease stays live. Before, it released the
// fresh hold: another owner took the name while the first goroutine held
// it with a live lease. ("Unlock never affects ... a later hold of the same
// owner.")
func TestOwnerUnlockOfALostLevelSparesALaterHold(t *testing.T) {
	kinds := []struct {
		name string
		hold func(c *dsync.Client, name string, opts ...dsync.Option) holdCalls
		key  func(name string) []string
	}{
		{"Mutex", func(c *dsync.Client, n string, o ...dsync.Option) holdCalls {
			m := c.Mutex(n, o...)
			return holdCalls{m.Lock, m.TryLock, m.Unlock, m.Lease}
		}, func(n string) []string { return []string{mutexKeys(n).Lock} }},
		{"RWMutex write", func(c *dsync.Client, n string, o ...dsync.Option) holdCalls {
			rw := c.RWMutex(n, o...)
			return holdCalls{rw.Lock, rw.TryLock, rw.Unlock, rw.Lease}
		}, func(n string) []string { return []string{rwk(n).Writer} }},
		{"RWMutex read", func(c *dsync.Client, n string, o ...dsync.Option) holdCalls {
			rw := c.RWMutex(n, o...)
			return holdCalls{rw.RLock, rw.TryRLock, rw.RUnlock, rw.RLease}
		}, func(n string) []string { return []string{rwk(n).Readers, rwk(n).ReaderData} }},
	}
	for _, k := range kinds {
		for _, mode := range []string{"script", "client"} {
			t.Run(k.name+"/"+mode+" reentrancy", func(t *testing.T) {
				eachBackend(t, func(t *testing.T, b redistest.Backend) {
					ctx, name := ctxT(t), redistest.Key(t)
					opts := []dsync.Option{dsync.TTL(600 * time.Millisecond)} // renewed every 200 ms
					if mode == "client" {
						opts = append(opts, dsync.ClientReentrancy())
					}
					c := newClient(t, b)
					probe := newClient(t, b)
					h := k.hold(c, name, opts...)
					own := dsync.WithOwner(ctx) // used by two goroutines, g1 and g2
					must(t, h.lock(own))        // g1
					must(t, h.lock(own))        // g2 re-enters
					lost, err := h.lease(own)
					must(t, err)
					must(t, b.NewClient(t).Del(ctx, k.key(name)...).Err())
					waitDone(t, lost, 5*time.Second, "the deletion of the hold")
					mustIs(t, h.unlock(own), dsync.ErrLeaseLost, "g1's Unlock of the lost hold: %v, want ErrLeaseLost")
					// g1 locks again: a fresh hold.
					must(t, h.lock(own))
					fresh, err := h.lease(own)
					must(t, err)
					// g2's Unlock of its level of the lost hold.
					mustIs(t, h.unlock(own), dsync.ErrLeaseLost, "g2's Unlock of its level of the lost hold: %v, want ErrLeaseLost")
					if err := fresh.Err(); err != nil {
						t.Fatalf("the fresh hold's lease after g2's Unlock: %v, want live", err)
					}
					select {
					case <-fresh.Done():
						t.Fatal("g2's Unlock of its level of the lost hold ended g1's fresh hold")
					default:
					}
					if otherWriterTakes(t, ctx, probe, k.name, name) {
						t.Fatal("another owner took the name while g1 holds it, its lease live")
					}
					must(t, h.unlock(own)) // g1
					waitDone(t, fresh, 5*time.Second, "g1's Unlock of the fresh hold")
					if err := fresh.Err(); err != nil {
						t.Fatalf("the fresh hold's lease after its Unlock: %v, want released", err)
					}
					if !otherWriterTakes(t, ctx, probe, k.name, name) {
						t.Fatal("the name is still held after every level was unlocked")
					}
					mustIs(t, h.unlock(own), dsync.ErrNotHeld, "an Unlock more than the Locks: %v, want ErrNotHeld")
				})
			})
		}
	}
}
