package renew

import (
	"container/heap"
	"math"
	"time"
)

// maxCoalesce bounds how early a hold may be renewed so that it shares a
// round trip with holds due slightly before it; a hold's own window is
// the smaller of this and a tenth of its interval.
const maxCoalesce = 50 * time.Millisecond

// renewAllNow makes every renewable hold due, runs one pass over them on the
// Renewer's goroutine — the same code path as a timer tick — and returns when
// that pass is done. Used by benchmarks.
func (r *Renewer) renewAllNow() {
	reply := make(chan struct{})
	select {
	case r.force <- reply:
		<-reply
	case <-r.exited:
	}
}

func (r *Renewer) run() {
	defer close(r.exited)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var forced chan struct{}
	for {
		r.pass(forced)
		forced = nil
		if r.ctx.Err() != nil {
			break
		}
		var tick <-chan time.Time
		if wait, ok := r.untilNext(); ok {
			timer.Reset(time.Duration(wait))
			tick = timer.C
		}
		// A hold added after untilNext with an earlier time pokes wake.
		select {
		case <-tick:
		case <-r.wake:
		case forced = <-r.force:
			r.makeAllDue()
			// The sender closes forced once it has sent this pass.
		case <-r.ctx.Done():
		}
		timer.Stop()
	}
	r.shutdown()
}

// untilNext reports how long until the heap's head needs attention, and
// whether there is a head at all.
func (r *Renewer) untilNext() (int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.holds) == 0 {
		r.armed = math.MaxInt64
		return 0, false
	}
	r.armed = r.holds[0].when
	return max(r.holds[0].when-r.now(), 0), true
}

func (r *Renewer) makeAllDue() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	for _, h := range r.holds {
		if !h.fixed && !h.inflight {
			h.when = min(h.when, now)
		}
	}
	heap.Init(&r.holds)
}

// shutdown ends every hold left after the goroutine stopped.
func (r *Renewer) shutdown() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.holds) > 0 {
		r.holds[len(r.holds)-1].endLocked(closed)
	}
}

// pass takes every hold that needs attention now — losing those whose
// conservative deadline has passed (in flight or not), parking those that may
// not be renewed until they run out — and queues the rest for the sender in
// batches. Queued holds stay in the heap, keyed by their deadline.
func (r *Renewer) pass(marker chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	parked := r.parked[:0]
	var due []*Hold
	for len(r.holds) > 0 {
		h := r.holds[0]
		if h.when > now+int64(maxCoalesce) {
			break
		}
		heap.Pop(&r.holds)
		switch {
		case now >= h.lostAt():
			h.endLocked(lost)
		case h.inflight:
			parked = append(parked, h) // its deadline is not here yet
		case !h.mayRenew(now):
			// Fixed, or bounded by MaxHold: it runs out at its deadline.
			h.fixed = true
			h.when = h.lostAt()
			parked = append(parked, h)
		case h.when > now+h.window():
			parked = append(parked, h) // not yet, not even coalesced
		default:
			h.inflight = true
			h.when = h.lostAt()
			parked = append(parked, h)
			due = append(due, h)
		}
	}
	for _, h := range parked {
		heap.Push(&r.holds, h)
	}
	clear(parked)
	r.parked = parked[:0]

	for len(due) > 0 {
		n := min(len(due), r.cfg.batch)
		r.queue = append(r.queue, batch{hs: due[:n:n]})
		due = due[n:]
	}
	if marker != nil {
		r.queue = append(r.queue, batch{done: marker})
	}
	if len(r.queue) > 0 {
		select {
		case r.work <- struct{}{}:
		default:
		}
	}
}
