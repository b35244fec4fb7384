package model

// Semaphore is the model of dsync.Semaphore with size permits.
//
//   - A holder's permits form one holding with one lease: a handle is one
//     holder for all its acquisitions, like an owner. Acquiring adds to the
//     holding (its fence and its deadline stay: holdings are fixed leases,
//     see dsync.FixedLease); a fresh holding gets the next fence.
//   - TryAcquire(n) succeeds if n permits are free and nobody waits (the
//     queue is FIFO; in a sequential history nobody waits). Permits of an
//     expired holding are free again. n outside 1..size is Invalid.
//   - Release(n) gives back n of the caller's permits; all of them end the
//     holding. More than it holds is TooMany and changes nothing; nothing
//     held is LeaseLost if its process remembers a holding, else NotHeld.
//   - A handle (not an owner) owes the permits of a holding of its that was
//     lost: when a fresh holding replaces the one it remembers, or a Release
//     of fewer than that holding had finds it gone, the rest is owed.
//     Release settles owed permits first (LeaseLost; a Release of more than
//     is owed releases the rest from the live holding and is LeaseLost too,
//     unless that part fails, which then changes nothing).
type Semaphore struct {
	clk      *Clock
	ttl      int64
	size     int64
	holdings map[string]*hold // holder ID -> holding
	fences   uint64
	known    map[string]*hold
	owed     map[string]int64 // handle ID -> permits of lost holdings not yet released
}

// NewSemaphore returns a Semaphore of size permits whose holdings last ttl ms.
func NewSemaphore(clk *Clock, ttl, size int64) *Semaphore {
	return &Semaphore{clk: clk, ttl: ttl, size: size, holdings: make(map[string]*hold), known: make(map[string]*hold), owed: make(map[string]int64)}
}

func (s *Semaphore) prune() {
	now := s.clk.Now()
	for t, h := range s.holdings {
		if !h.alive(now) {
			delete(s.holdings, t)
		}
	}
}

// Used returns the permits held by live holdings.
func (s *Semaphore) Used() int64 {
	s.prune()
	var n int64
	for _, h := range s.holdings {
		n += h.count
	}
	return n
}

// Held returns the permits h holds.
func (s *Semaphore) Held(h Holder) int64 {
	s.prune()
	if x := s.holdings[h.ID]; x != nil {
		return x.count
	}
	return 0
}

// TryAcquire reports whether h got n more permits and whether its holding
// is fresh.
func (s *Semaphore) TryAcquire(h Holder, n int64) (ok, isFresh bool, e Err) {
	if n <= 0 || n > s.size {
		return false, false, Invalid
	}
	if s.Used()+n > s.size {
		return false, false, OK
	}
	now := s.clk.Now()
	if x := s.holdings[h.ID]; x != nil {
		x.count += n // the deadline stays (a fixed lease)
		s.known[h.ID] = x
		return true, false, OK
	}
	if k := s.known[h.ID]; k != nil && !h.Owner {
		s.owed[h.ID] += k.count // the remembered holding was lost
	}
	s.fences++
	x := &hold{tok: h.ID, count: n, deadline: now + s.ttl, fence: s.fences}
	s.holdings[h.ID] = x
	s.known[h.ID] = x
	return true, true, OK
}

// Release gives back n of h's permits.
func (s *Semaphore) Release(h Holder, n int64) Err {
	if n <= 0 || n > s.size {
		return Invalid
	}
	if settled := min(n, s.owed[h.ID]); settled > 0 {
		s.owed[h.ID] -= settled
		if settled == n {
			return LeaseLost
		}
		if e := s.Release(h, n-settled); e != OK && e != LeaseLost {
			s.owed[h.ID] += settled
			return e
		}
		return LeaseLost
	}
	s.prune()
	x := s.holdings[h.ID]
	if x == nil {
		if k := s.known[h.ID]; k != nil {
			delete(s.known, h.ID)
			if !h.Owner {
				s.owed[h.ID] += max(k.count-n, 0)
			}
			return LeaseLost
		}
		return NotHeld
	}
	switch {
	case n > x.count:
		return TooMany
	case n == x.count:
		delete(s.holdings, h.ID)
		delete(s.known, h.ID)
	default:
		x.count -= n
	}
	return OK
}

// Lease returns the fence of h's remembered holding.
func (s *Semaphore) Lease(h Holder) (uint64, Err) { return s.known[h.ID].lease() }
