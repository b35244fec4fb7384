// Package model is the specification of dsync's primitives: a sequential,
// in-memory reference model of Mutex, RWMutex, Once and Semaphore, with a
// logical clock so that leases expire. It talks to no Redis. The property
// tests of package dsync drive the real primitives and this model with the
// same random history and require the same results.
//
// The model describes what one caller observes. A holder ([Holder]) is
// either a handle used without an owner in ctx (not reentrant: every
// acquisition through it is a new hold, with a fresh token) or an owner
// (reentrant: its acquisitions add up). An owner is assumed to act through
// one process, whose memory of its holds decides between [LeaseLost] (the
// process knew a hold that has ended without a release) and [NotHeld].
//
// Time is in milliseconds. A hold taken or re-entered at time t with TTL d
// lasts while now < t+d; at now ≥ t+d it is gone (fixed leases: nothing is
// renewed). Fencing tokens are modelled by their order only: the k-th fresh
// acquisition of a name has fence k, and a real token must be larger than
// every earlier one; a re-entry keeps its hold's fence.
package model

import "strconv"

// Err is the outcome of a call, named after dsync's sentinel errors.
type Err int

// The outcomes.
const (
	OK        Err = iota // success
	NotHeld              // dsync.ErrNotHeld
	LeaseLost            // dsync.ErrLeaseLost
	Upgrade              // dsync.ErrUpgrade
	Invalid              // dsync.ErrInvalid
	TooMany              // Semaphore.Release of more than held: ErrNotHeld and ErrInvalid
	Failed               // Once: f's own error
)

// String returns the name of the sentinel error, or "ok".
func (e Err) String() string {
	switch e {
	case OK:
		return "ok"
	case NotHeld:
		return "ErrNotHeld"
	case LeaseLost:
		return "ErrLeaseLost"
	case Upgrade:
		return "ErrUpgrade"
	case Invalid:
		return "ErrInvalid"
	case TooMany:
		return "ErrNotHeld+ErrInvalid"
	case Failed:
		return "f's error"
	}
	return "Err(" + strconv.Itoa(int(e)) + ")"
}

// Clock is the logical clock, in ms, shared by the primitives of one model.
type Clock struct{ now int64 }

// Now returns the current time.
func (c *Clock) Now() int64 { return c.now }

// Advance moves the clock d ms forward.
func (c *Clock) Advance(d int64) { c.now += d }

// Holder is who acquires: an owner (Owner true; ID is the owner token) or a
// handle used without an owner (ID names the handle).
type Holder struct {
	ID    string
	Owner bool
}

// hold is a hold on the server: its token, count and deadline.
type hold struct {
	tok      string
	count    int64
	deadline int64
	fence    uint64
}

func (h *hold) alive(now int64) bool { return h != nil && now < h.deadline }

// unlock releases one level of cur, the live exclusive hold (nil if
// none), for the holder called id, whose process remembers the hold
// known[id], and reports whether cur ended. A remembered hold that is not
// cur was lost.
func unlock(cur *hold, known map[string]*hold, id string) (ended bool, e Err) {
	k := known[id]
	if cur != nil && k == cur {
		cur.count--
		if cur.count > 0 {
			return false, OK
		}
		delete(known, id)
		return true, OK
	}
	if k != nil {
		delete(known, id)
		return false, LeaseLost
	}
	return false, NotHeld
}

// lease returns the fence of h, a hold a process remembers (nil: none),
// as a Lease call finds it.
func (h *hold) lease() (uint64, Err) {
	if h == nil {
		return 0, NotHeld
	}
	return h.fence, OK
}

// fresh returns the token of a new acquisition by h: the owner token, or a
// token never used before for a handle.
func fresh(h Holder, seq *uint64) string {
	if h.Owner {
		return h.ID
	}
	*seq++
	return h.ID + "#" + strconv.FormatUint(*seq, 10)
}
