package dsync_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/redistest"
)

// The two reentrancy modes hold under different tokens in Redis and count
// levels in different places, so an owner's calls on one name in one
// Client through handles of both modes are refused while it holds the
// name through the other, with an error matching ErrInvalid, and change
// nothing. Before, a Lock through the other handle "re-entered" in the
// process without Redis counting it, the first handle's Unlock then freed
// the name while the owner still had a Lock without its Unlock, and an
// Unlock through a handle of the other mode marked the live hold's lease
// lost.
func TestOwnerHandlesOfBothReentrancyModes(t *testing.T) {
	kinds := []struct {
		name string
		hold func(c *dsync.Client, name string, opts ...dsync.Option) holdCalls
	}{
		{"Mutex", func(c *dsync.Client, n string, o ...dsync.Option) holdCalls {
			m := c.Mutex(n, o...)
			return holdCalls{m.Lock, m.TryLock, m.Unlock, m.Lease}
		}},
		{"RWMutex write", func(c *dsync.Client, n string, o ...dsync.Option) holdCalls {
			rw := c.RWMutex(n, o...)
			return holdCalls{rw.Lock, rw.TryLock, rw.Unlock, rw.Lease}
		}},
		{"RWMutex read", func(c *dsync.Client, n string, o ...dsync.Option) holdCalls {
			rw := c.RWMutex(n, o...)
			return holdCalls{rw.RLock, rw.TryRLock, rw.RUnlock, rw.RLease}
		}},
	}
	for _, k := range kinds {
		for _, first := range []string{"script", "client"} {
			t.Run(k.name+"/held through the "+first+" reentrancy handle", func(t *testing.T) {
				eachBackend(t, func(t *testing.T, b redistest.Backend) {
					ctx, name := ctxT(t), redistest.Key(t)
					c := newClient(t, b)
					probe := newClient(t, b)
					script, local := k.hold(c, name), k.hold(c, name, dsync.ClientReentrancy())
					holder, other := script, local
					if first == "client" {
						holder, other = local, script
					}
					own := dsync.WithOwner(ctx)
					must(t, holder.lock(own))
					l, err := holder.lease(own)
					must(t, err)

					mustIs(t, other.lock(own), dsync.ErrInvalid, "Lock through a handle of the other mode: %v, want ErrInvalid")
					ok, err := other.try(own)
					mustIs(t, err, dsync.ErrInvalid, "TryLock through a handle of the other mode: %v, want ErrInvalid")
					if ok {
						t.Fatal("TryLock through a handle of the other mode took it")
					}
					mustIs(t, other.unlock(own), dsync.ErrInvalid, "Unlock through a handle of the other mode: %v, want ErrInvalid")
					if err := l.Err(); err != nil {
						t.Fatalf("the hold's lease after the refused calls: %v, want live", err)
					}
					if free := otherWriterTakes(t, ctx, probe, k.name, name); free {
						t.Fatal("the name is free while its owner holds it")
					}
					// The owner's calls through the handle it holds with
					// work as before.
					must(t, holder.lock(own))
					must(t, holder.unlock(own))
					must(t, holder.unlock(own))
					waitDone(t, l, 5*time.Second, "the last Unlock")
					if err := l.Err(); err != nil {
						t.Fatalf("lease after the last Unlock: %v, want released", err)
					}
					if free := otherWriterTakes(t, ctx, probe, k.name, name); !free {
						t.Fatal("the name is still held after the owner's last Unlock")
					}
					// Once the owner holds nothing, either handle may take it.
					must(t, other.lock(own))
					must(t, other.unlock(own))
				})
			})
		}
	}
}

// An owner that reads an RWMutex through a handle of one reentrancy mode
// and asks for the write lock through a handle of the other gets
// ErrUpgrade at once, as through one handle. Before, the two modes' tokens
// differ in Redis, which took the owner's read hold for another owner's,
// and the Lock waited until its ctx ended.
func TestOwnerUpgradeAcrossReentrancyModes(t *testing.T) {
	for _, readLocal := range []bool{false, true} {
		t.Run(map[bool]string{false: "read through script reentrancy", true: "read through client reentrancy"}[readLocal], func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b redistest.Backend) {
				ctx, name := ctxT(t), redistest.Key(t)
				c := newClient(t, b)
				script, local := c.RWMutex(name), c.RWMutex(name, dsync.ClientReentrancy())
				reader, writer := script, local
				if readLocal {
					reader, writer = local, script
				}
				own := dsync.WithOwner(ctx)
				must(t, reader.RLock(own))
				lctx, cancel := context.WithTimeout(own, 5*time.Second)
				defer cancel()
				mustIs(t, writer.Lock(lctx), dsync.ErrUpgrade, "Lock while reading through the other handle: %v, want ErrUpgrade")
				if lctx.Err() != nil {
					t.Fatal("the upgrade was refused only when its ctx ended")
				}
				must(t, reader.RUnlock(own))
				must(t, writer.Lock(own))
				must(t, writer.Unlock(own))
			})
		})
	}
}

// otherWriterTakes reports whether another owner takes name (a Mutex, or
// an RWMutex's write lock for kinds of an RWMutex) at once through c, and
// lets it go again.
func otherWriterTakes(t *testing.T, ctx context.Context, c *dsync.Client, kind, name string) bool {
	t.Helper()
	other := dsync.WithOwner(ctx)
	h := mutexHold(c, name)
	if kind != "Mutex" {
		h = writeHold(c, name)
	}
	ok, err := h.try(other)
	must(t, err)
	if ok {
		must(t, h.unlock(other))
	}
	return ok
}
