package renew

import (
	"container/heap"
	"time"

	"github.com/redis/go-redis/v9"
)

// Hold states.
const (
	live uint8 = iota
	released
	lost
	closed
)

// closedChan is the Done channel of a hold that ended before anyone asked.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// A Hold is one lease kept alive by a Renewer, from Renewer.Add until it ends.
// Its methods are safe for concurrent use.
type Hold struct {
	r      *Renewer
	script *redis.Script
	batch  *redis.Script // renews many holds at once, or nil
	keys   []string
	args   []any
	cmd    []any                    // EVALSHA sha numkeys keys... args..., boxed at the first renewal
	onLost interface{ LeaseLost() } // Spec.Lost

	// Nanoseconds since r.epoch, or durations; fixed at Add.
	ttl      int64
	interval int64
	limit    int64 // no renewal may set a deadline past this (Start+MaxHold)

	// Guarded by r.mu.
	deadline int64 // send time of the last renewal (or Start) + TTL
	when     int64 // heap key: when the hold next needs attention
	done     chan struct{}
	index    int32 // in r.holds, or -1 when out of the heap
	state    uint8
	fixed    bool // renewed no more: runs out at its deadline
	inflight bool // queued or sent; keyed in the heap by its deadline
	// Releases of the hold under way (see Releasing), and whether a
	// renewal found the hold gone meanwhile.
	releasing int32
	gone      bool
}

// Done returns a channel that is closed when the hold ends: released, lost,
// run out, or its Renewer closed. Err tells which.
func (h *Hold) Done() <-chan struct{} {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	if h.done == nil {
		if h.state != live {
			return closedChan
		}
		h.done = make(chan struct{})
	}
	return h.done
}

// Err returns nil while the hold is live, after Release, and after the
// Renewer was closed. It returns the Renewer's lost error (see LostError) once
// the hold is lost: a renewal found it gone, renewals failed until its
// conservative deadline, MarkLost was called, or a lease that may not be
// renewed (fixed, or bounded by MaxHold) ran out — from then on nothing
// guarantees the hold.
func (h *Hold) Err() error {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	if h.state == lost {
		return h.r.cfg.lost
	}
	return nil
}

// Release ends the hold because the holder released it: no renewal is sent
// for it from now on (one already in flight may still reach the server; its
// reply is ignored), Done is closed and Err stays nil. Release is idempotent
// and does nothing to a hold that already ended.
func (h *Hold) Release() { h.end(released) }

// MarkLost ends the hold because the holder learned elsewhere that it is gone
// (for example the unlock script said so): renewal stops, Done is closed and
// Err returns the lost error. It does nothing to a hold that already ended.
func (h *Hold) MarkLost() { h.end(lost) }

// Releasing notes that a release of the hold was sent (on) or is over
// (off); each on is matched by one off. While a release is under way, a
// renewal that finds the hold gone does not end it, since the release may
// have ended it itself: the release's outcome, Release or MarkLost, tells
// which. The hold is renewed no more meanwhile, and is lost at its
// conservative deadline if no outcome comes first. When the last release
// under way is over and the hold still lives (its release ended only part
// of it, or its outcome is unknown), such a finding stands: the hold is
// lost.
func (h *Hold) Releasing(on bool) {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	if on {
		h.releasing++
		return
	}
	if h.releasing > 0 {
		h.releasing--
	}
	if h.releasing == 0 && h.gone {
		h.endLocked(lost)
	}
}

// Deadline returns the conservative local time before which the server
// certainly still holds the lease: the local send time of the last successful
// renewal (or Spec.Start) plus TTL, less a drift allowance of TTL/100 + 2ms.
// The hold is reported lost at this time unless a renewal succeeds first.
func (h *Hold) Deadline() time.Time {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	return h.r.epoch.Add(time.Duration(h.lostAt()))
}

func (h *Hold) end(st uint8) {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	h.endLocked(st)
}

// endLocked ends a live hold with state st. r.mu must be held.
func (h *Hold) endLocked(st uint8) {
	if h.state != live {
		return
	}
	h.state = st
	if h.index >= 0 {
		// If the timer was set for this hold it fires early, finds nothing
		// due and is set again: cheaper than waking the scheduler now.
		heap.Remove(&h.r.holds, int(h.index))
	}
	h.r.live--
	if h.done != nil {
		close(h.done)
	}
	if st == lost && h.onLost != nil {
		go h.onLost.LeaseLost()
	}
}

// lostAt is the conservative deadline: the hold is lost from then on.
func (h *Hold) lostAt() int64 {
	return h.deadline - (h.ttl/100 + int64(2*time.Millisecond))
}

// mayRenew reports whether a renewal sent at now may be sent: the hold is
// not fixed and the extension stays within MaxHold.
func (h *Hold) mayRenew(now int64) bool {
	return !h.fixed && satAdd(now, h.ttl) <= h.limit
}

// window is how early the hold may be renewed to share a round trip.
func (h *Hold) window() int64 {
	return min(int64(maxCoalesce), h.interval/10)
}

// holdHeap is a min-heap of holds by when, for container/heap.
type holdHeap []*Hold

func (q holdHeap) Len() int           { return len(q) }
func (q holdHeap) Less(i, j int) bool { return q[i].when < q[j].when }
func (q holdHeap) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index = int32(i)
	q[j].index = int32(j)
}

func (q *holdHeap) Push(x any) {
	h := x.(*Hold)
	h.index = int32(len(*q))
	*q = append(*q, h)
}

func (q *holdHeap) Pop() any {
	old := *q
	n := len(old) - 1
	h := old[n]
	old[n] = nil
	h.index = -1
	*q = old[:n]
	return h
}
