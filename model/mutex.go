package model

// Mutex is the model of dsync.Mutex.
//
//   - TryLock succeeds if nobody holds the lock (a fresh hold, with the next
//     fence), or if the caller is the owner that holds it (a re-entry: the
//     count goes up, the fence and the deadline stay: holds are fixed
//     leases, see dsync.FixedLease). A handle never
//     re-enters: its second TryLock fails while its hold lives.
//   - Unlock by the holder lowers the count and releases at zero. A caller
//     whose process remembers a hold that has ended gets LeaseLost (once:
//     the memory is then dropped); anyone else gets NotHeld.
//   - Lease returns the fence of the hold the caller's process remembers,
//     also after it was lost, until an Unlock reports the loss.
type Mutex struct {
	clk    *Clock
	ttl    int64
	cur    *hold            // the hold on the server; nil or dead when free
	fences uint64           // fresh acquisitions so far
	seq    uint64           // handle tokens
	known  map[string]*hold // holder ID -> the hold its process remembers
}

// NewMutex returns a free Mutex whose holds last ttl ms.
func NewMutex(clk *Clock, ttl int64) *Mutex {
	return &Mutex{clk: clk, ttl: ttl, known: make(map[string]*hold)}
}

func (m *Mutex) live() *hold {
	if m.cur.alive(m.clk.Now()) {
		return m.cur
	}
	m.cur = nil
	return nil
}

// TryLock reports whether h got (or re-entered) the lock, and whether the
// hold is fresh.
func (m *Mutex) TryLock(h Holder) (ok, isFresh bool) {
	now := m.clk.Now()
	if !h.Owner && m.known[h.ID] != nil {
		// A handle is locked from Lock to Unlock, also when its hold was
		// lost meanwhile.
		return false, false
	}
	if c := m.live(); c != nil {
		if h.Owner && c.tok == h.ID {
			c.count++
			return true, false
		}
		return false, false
	}
	m.fences++
	m.cur = &hold{tok: fresh(h, &m.seq), count: 1, deadline: now + m.ttl, fence: m.fences}
	m.known[h.ID] = m.cur
	return true, true
}

// Unlock releases one level of h's hold.
func (m *Mutex) Unlock(h Holder) Err {
	ended, e := unlock(m.live(), m.known, h.ID)
	if ended {
		m.cur = nil
	}
	return e
}

// Lease returns the fence of h's remembered hold.
func (m *Mutex) Lease(h Holder) (uint64, Err) { return m.known[h.ID].lease() }

// Holder returns the token and count of the live hold ("" if free).
func (m *Mutex) Holder() (string, int64) {
	if c := m.live(); c != nil {
		return c.tok, c.count
	}
	return "", 0
}

// Fences returns the number of fresh acquisitions so far.
func (m *Mutex) Fences() uint64 { return m.fences }
