package model

// Semaphore is the model of dsync.Semaphore with size permits.
//
//   - A holder's permits form one holding with one lease: a handle is one
//     holder for all its acquisitions, like an owner. Acquiring adds to the
//     holding (its fence stays; its deadline becomes the later of the old
//     one and now+TTL); a fresh holding gets the next fence.
//   - TryAcquire(n) succeeds if n permits are free and nobody waits (the
//     queue is FIFO; in a sequential history nobody waits). Permits of an
//     expired holding are free again. n outside 1..size is Invalid.
//   - Release(n) gives back n of the caller's permits; all of them end the
//     holding. More than it holds is TooMany and changes nothing; nothing
//     held is LeaseLost if its process remembers a holding, else NotHeld.
type Semaphore struct {
	clk      *Clock
	ttl      int64
	size     int64
	holdings map[string]*hold // holder ID -> holding
	fences   uint64
	known    map[string]*hold
}

// NewSemaphore returns a Semaphore of size permits whose holdings last ttl ms.
func NewSemaphore(clk *Clock, ttl, size int64) *Semaphore {
	return &Semaphore{clk: clk, ttl: ttl, size: size, holdings: make(map[string]*hold), known: make(map[string]*hold)}
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
		x.count += n
		x.deadline = max(x.deadline, now+s.ttl)
		s.known[h.ID] = x
		return true, false, OK
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
	s.prune()
	x := s.holdings[h.ID]
	if x == nil {
		if s.known[h.ID] != nil {
			delete(s.known, h.ID)
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
func (s *Semaphore) Lease(h Holder) (uint64, Err) {
	if k := s.known[h.ID]; k != nil {
		return k.fence, OK
	}
	return 0, NotHeld
}
