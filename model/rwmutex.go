package model

// RWMutex is the model of dsync.RWMutex.
//
//   - Any number of readers or one writer. Each reader has its own lease; a
//     dead reader's share is gone at its deadline whatever the others do.
//   - TryRLock: an owner that reads re-enters (count up, its lease restarts,
//     never blocked); an owner that writes may also read (a downgrade);
//     anyone else is refused while a writer holds the lock or a writer
//     waits (writer preference). A handle's every TryRLock is a new reader.
//   - TryLock: the writing owner re-enters; an owner that reads (and does
//     not write) gets Upgrade; anyone else is refused while anyone else
//     reads or writes. Waiting writers do not order writers among
//     themselves. A fresh write hold gets the next fence; reads have none.
//   - Unlock and RUnlock release one level of the caller's write or read
//     hold (a handle's RUnlock releases its latest read hold). A read hold
//     taken while writing stays after Unlock. LeaseLost and NotHeld as for
//     [Mutex].
//   - A waiting writer (Wait) holds a place until its deadline; it takes the
//     lock as soon as nobody else holds it (Grantable).
type RWMutex struct {
	clk     *Clock
	ttl     int64
	w       *hold
	readers map[string]*hold // reader token -> hold
	places  map[string]int64 // waiting writer token -> place deadline
	fences  uint64
	seq     uint64
	knownW  map[string]*hold   // holder ID -> remembered write hold
	knownR  map[string][]*hold // holder ID -> remembered read holds, latest last (one for an owner)
}

// NewRWMutex returns a free RWMutex whose holds last ttl ms.
func NewRWMutex(clk *Clock, ttl int64) *RWMutex {
	return &RWMutex{
		clk: clk, ttl: ttl,
		readers: make(map[string]*hold),
		places:  make(map[string]int64),
		knownW:  make(map[string]*hold),
		knownR:  make(map[string][]*hold),
	}
}

// prune drops what has expired by now.
func (rw *RWMutex) prune() {
	now := rw.clk.Now()
	if !rw.w.alive(now) {
		rw.w = nil
	}
	for t, r := range rw.readers {
		if !r.alive(now) {
			delete(rw.readers, t)
		}
	}
	for t, d := range rw.places {
		if now >= d {
			delete(rw.places, t)
		}
	}
}

// TryRLock reports whether h got (or re-entered) a read hold.
func (rw *RWMutex) TryRLock(h Holder) bool {
	rw.prune()
	now := rw.clk.Now()
	if h.Owner {
		if r := rw.readers[h.ID]; r != nil {
			r.count++ // the deadline stays (a fixed lease)
			return true
		}
	}
	tok := fresh(h, &rw.seq)
	mine := rw.w != nil && h.Owner && rw.w.tok == h.ID
	others := len(rw.places)
	if _, ok := rw.places[tok]; ok {
		others--
	}
	if !mine && (rw.w != nil || others > 0) {
		return false
	}
	// An owner whose Lock waits reads now: that Lock is an upgrade, and
	// its place goes.
	delete(rw.places, tok)
	r := &hold{tok: tok, count: 1, deadline: now + rw.ttl}
	rw.readers[tok] = r
	if h.Owner {
		rw.knownR[h.ID] = []*hold{r}
	} else {
		rw.knownR[h.ID] = append(rw.knownR[h.ID], r)
	}
	return true
}

// TryLock reports whether h got (or re-entered) the write hold, whether it
// is fresh, and Upgrade if h's owner reads.
func (rw *RWMutex) TryLock(h Holder) (ok, isFresh bool, e Err) {
	rw.prune()
	if !h.Owner && rw.knownW[h.ID] != nil {
		// A handle is write-locked from Lock to Unlock, also when its hold
		// was lost meanwhile.
		return false, false, OK
	}
	if h.Owner && rw.w != nil && rw.w.tok == h.ID {
		rw.w.count++ // the deadline stays (a fixed lease)
		return true, false, OK
	}
	if h.Owner && rw.readers[h.ID] != nil {
		delete(rw.places, h.ID)
		return false, false, Upgrade
	}
	if rw.w != nil || len(rw.readers) > 0 {
		return false, false, OK
	}
	rw.grantWrite(h, fresh(h, &rw.seq))
	return true, true, OK
}

func (rw *RWMutex) grantWrite(h Holder, tok string) {
	rw.fences++
	rw.w = &hold{tok: tok, count: 1, deadline: rw.clk.Now() + rw.ttl, fence: rw.fences}
	rw.knownW[h.ID] = rw.w
	delete(rw.places, tok)
}

// Wait records that owner h waits for the write lock (a blocking Lock that
// could not take it at once): its place lasts one TTL. It returns false if
// Lock would not wait (it takes the lock, or gets Upgrade): call TryLock.
func (rw *RWMutex) Wait(h Holder) bool {
	rw.prune()
	if !h.Owner || (rw.w != nil && rw.w.tok == h.ID) || rw.readers[h.ID] != nil {
		return false
	}
	if rw.w == nil && len(rw.readers) == 0 {
		return false
	}
	rw.places[h.ID] = rw.clk.Now() + rw.ttl
	return true
}

// Waiting reports whether owner h's place is still there.
func (rw *RWMutex) Waiting(h Holder) bool {
	rw.prune()
	_, ok := rw.places[h.ID]
	return ok
}

// Grantable reports whether waiting owner h takes the write lock now
// (nobody holds it); if so, it is granted.
func (rw *RWMutex) Grantable(h Holder) bool {
	rw.prune()
	if _, ok := rw.places[h.ID]; !ok || rw.w != nil || len(rw.readers) > 0 {
		return false
	}
	rw.grantWrite(h, h.ID)
	return true
}

// Abandon drops owner h's place (its Lock call ended without the lock).
func (rw *RWMutex) Abandon(h Holder) { delete(rw.places, h.ID) }

// Unlock releases one level of h's write hold.
func (rw *RWMutex) Unlock(h Holder) Err {
	rw.prune()
	ended, e := unlock(rw.w, rw.knownW, h.ID)
	if ended {
		rw.w = nil
	}
	return e
}

// RUnlock releases one level of h's read hold (a handle's latest).
func (rw *RWMutex) RUnlock(h Holder) Err {
	rw.prune()
	ks := rw.knownR[h.ID]
	if len(ks) == 0 {
		return NotHeld
	}
	k := ks[len(ks)-1]
	if rw.readers[k.tok] != k {
		rw.knownR[h.ID] = ks[:len(ks)-1]
		return LeaseLost
	}
	k.count--
	if k.count == 0 {
		delete(rw.readers, k.tok)
		rw.knownR[h.ID] = ks[:len(ks)-1]
	}
	return OK
}

// Lease returns the fence of h's remembered write hold.
func (rw *RWMutex) Lease(h Holder) (uint64, Err) { return rw.knownW[h.ID].lease() }

// Writer returns the live writer's token ("" if none) and the number of
// live readers.
func (rw *RWMutex) Writer() (string, int) {
	rw.prune()
	if rw.w != nil {
		return rw.w.tok, len(rw.readers)
	}
	return "", len(rw.readers)
}
