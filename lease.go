package dsync

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsync-go/dsync/renew"
)

// A Lease is the lease of one hold, as returned by a primitive's Lease
// method. While the hold lives, the Client renews it; Done tells the holder
// when it ends.
type Lease struct {
	h        *renew.Hold
	token    uint64
	released *atomic.Bool
}

// Done returns a channel that is closed when the hold ends: released,
// lost, or no longer renewed because the Client was closed.
func (l *Lease) Done() <-chan struct{} { return l.h.Done() }

// Err returns nil while the hold lives and after it was released;
// [ErrLeaseLost] once it was lost (expired, deleted, taken over, or a fixed
// lease ran out); [ErrClosed] if the Client was closed while it was held.
func (l *Lease) Err() error {
	select {
	case <-l.h.Done():
	default:
		return nil
	}
	if err := l.h.Err(); err != nil {
		return err
	}
	if l.released.Load() {
		return nil
	}
	return ErrClosed
}

// Token returns the hold's fencing token: every fresh acquisition of a name
// gets a token larger than all earlier ones of that name, and re-entry keeps
// it. Pass it to storage that can reject writes from a stale holder.
func (l *Lease) Token() uint64 { return l.token }

// holdKey names the hold of one owner on one key.
type holdKey struct{ key, tok string }

// hold is this process's view of one hold.
type hold struct {
	tok      string
	fence    uint64
	count    int // re-entries made through this process (owner mode)
	lease    *renew.Hold
	released atomic.Bool
	unlockID string // id of an unlock whose reply was lost, reused on retry

	subs []*hold // quorum mode: the hold on each member, nil where not granted
}

func (h *hold) leaseView() *Lease {
	return &Lease{h: h.lease, token: h.fence, released: &h.released}
}

// lost reports whether the renewer found the hold gone.
func (h *hold) lost() bool {
	select {
	case <-h.lease.Done():
		return h.lease.Err() != nil
	default:
		return false
	}
}

func (h *hold) release() {
	h.released.Store(true)
	h.lease.Release()
}

// startHold begins renewing a hold taken at start.
func (c *Client) startHold(cfg *config, spec renew.Spec, tok string, fence uint64, start time.Time) *hold {
	spec.TTL = cfg.ttl
	spec.Interval = cfg.interval
	spec.MaxHold = cfg.maxHold
	spec.Start = start
	return &hold{tok: tok, fence: fence, count: 1, lease: c.renew.Add(spec)}
}

// ownerHold records a hold (or a re-entry) of an owner carried in ctx.
func (c *Client) ownerHold(k holdKey, fence uint64, newHold func() *hold) *hold {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := c.holds[k]; h != nil && h.fence == fence && !h.lost() {
		h.count++
		return h
	} else if h != nil {
		h.release()
	}
	h := newHold()
	c.holds[k] = h
	return h
}

// reenter counts a re-entry of a live hold recorded under k in this
// process (client reentrancy), and reports whether there was one.
func (c *Client) reenter(k holdKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.holds[k]
	if h == nil || h.lost() {
		return false
	}
	h.count++
	return true
}

// leave counts an inner unlock of a hold recorded under k (client
// reentrancy) and reports whether it was one: false means the next unlock
// must go to Redis.
func (c *Client) leave(k holdKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.holds[k]
	if h == nil || h.count <= 1 || h.lost() {
		return false
	}
	h.count--
	return true
}

func (c *Client) lookupHold(k holdKey) *hold {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.holds[k]
}

// dropHold forgets h if it is still the hold recorded under k.
func (c *Client) dropHold(k holdKey, h *hold) {
	c.mu.Lock()
	if c.holds[k] == h {
		delete(c.holds, k)
	}
	c.mu.Unlock()
}

// handleHold is what a call finds through a handle: the hold of ctx's
// owner, recorded under key, or without an owner the handle's own hold *cur,
// guarded by mu.
func (c *Client) handleHold(ctx context.Context, key string, mu *sync.Mutex, cur **hold) (*hold, error) {
	tok, owned, err := owner(ctx)
	if err != nil {
		return nil, err
	}
	var h *hold
	if owned {
		h = c.lookupHold(holdKey{key, tok})
	} else {
		mu.Lock()
		h = *cur
		mu.Unlock()
	}
	if h == nil {
		return nil, ErrNotHeld
	}
	return h, nil
}

// forgetHold forgets h, the hold of owner tok recorded under key, or the
// handle's own hold *cur.
func (c *Client) forgetHold(key string, owned bool, tok string, h *hold, mu *sync.Mutex, cur **hold) {
	if owned {
		c.dropHold(holdKey{key, tok}, h)
		return
	}
	mu.Lock()
	if *cur == h {
		*cur = nil
	}
	mu.Unlock()
}
