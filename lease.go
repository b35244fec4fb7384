package dsync

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsync-go/dsync/renew"
)

// A Lease is the lease of one hold, as returned by a primitive's Lease
// method. While the hold lives, the Client renews it; Done tells the holder
// when it ends.
type Lease struct {
	h        leaser
	token    uint64
	released *atomic.Bool
}

// Done returns a channel that is closed when the hold ends: released,
// lost, or no longer renewed because the Client was closed.
func (l *Lease) Done() <-chan struct{} { return l.h.Done() }

// Err returns nil while the hold lives and after it was released;
// [ErrLeaseLost] once it was lost (expired, deleted, taken over, or a fixed
// lease ran out); [ErrClosed] if the Client (or Quorum) was closed while it
// was held.
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

// A leaser keeps the lease of one hold: a [renew.Hold] on one deployment,
// a quorumLease over a quorum of masters (quorum_lease.go).
type leaser interface {
	Done() <-chan struct{}
	Err() error // ErrLeaseLost once lost
	Release()   // the holder released it: renewal stops, Err stays nil
	MarkLost()  // the holder learned it is gone
	// Releasing notes a release of the hold sent (on) or over (off):
	// meanwhile a renewal that finds the hold gone leaves it to the
	// release's outcome (see renew.Hold.Releasing).
	Releasing(on bool)
}

var _ leaser = (*renew.Hold)(nil)

// holdKey names the hold of one owner on one key.
type holdKey struct{ key, tok string }

// A holdID names one hold: its holder token and its fence. tokArg and
// fenceArg are the two as the unlock scripts take them, if the call that
// took the hold had them boxed already (the reply of its grant carried the
// fence); nil, they are boxed when needed.
type holdID struct {
	tok    string
	tokArg any
	// The hold's fencing token; for an RWMutex read hold, which has none,
	// the hold id its grant carried (its Lease shows 0; a quorum read
	// hold has 0, and its member holds carry their masters' ids). Either
	// tells this hold from the holder's later ones.
	fence    uint64
	fenceArg any // fence as an integer
}

// arg returns the fence of id as the scripts take it (renewals name the
// hold they extend by it).
func (id holdID) arg() any {
	if id.fenceArg != nil {
		return id.fenceArg
	}
	return id.fence
}

// hold is this process's view of one hold.
type hold struct {
	holdID
	count int // re-entries made through this process (owner mode)
	// releasing, while the owner's last release of the hold is under way
	// (client reentrancy), is closed once it is over; then the hold is
	// gone (and forgotten) unless the release failed. Guarded by base.mu.
	releasing chan struct{}
	lease     leaser
	released  atomic.Bool
	idMu      sync.Mutex
	unlockID  string // id of an unlock whose reply was lost, reused on retry
	// Whether the lease was reported lost when the unlock of unlockID (or
	// the Release of unsureID) was first sent: the hold's end that the
	// renewer reports meanwhile may be that unlock's own doing.
	lostAtSend bool
	// A Semaphore holding: the permits this process knows it holds
	// (owner holdings; a handle counts its own), and the call id and
	// permits of a Release of them all whose outcome is unknown (guarded
	// by idMu; see Semaphore.release).
	permits  atomic.Int64
	unsureID string
	unsureN  int64
	// relMu makes the releases of this hold in this process run one at a
	// time (see lockedHold).
	relMu sync.Mutex
	// Owner holds only, guarded by base.mu: unlocks of the hold in flight,
	// and whether ownerHold recorded a later hold of the owner meanwhile
	// (see base.unlocking).
	unlocking int
	replaced  bool
	// Owner holds only, guarded by base.mu: levels (permits) of earlier
	// holds of the owner whose releases are still to come in this
	// process, which this hold took over (see owe); and whether it is a
	// Semaphore holding, whose levels are its permits.
	owes    int64
	holding bool
	// Owner holds only, guarded by base.mu: the hold of the owner this one
	// replaced whose unlock got no reply (its outcome unknown, its id kept
	// for a repeat): the owner's next unlock is that repeat, and settles
	// that unlock under its id and name (see unlockOwner), rather than end
	// a level of this hold.
	repeat *hold
	// cohort: the hold was taken by a member of its Client's cohort of the
	// name (see cohort.go), whose membership its first release or its loss
	// ends (and clears cohort); co and coKey name that cohort.
	cohort atomic.Bool
	co     *cohorts
	coKey  string
}

func (h *hold) leaseView() *Lease {
	return &Lease{h: h.lease, token: h.fence, released: &h.released}
}

// lost reports whether the renewer found the hold gone.
func (h *hold) lost() bool {
	// A leaser's Err is not nil once it is lost, and only then (and so
	// only once it ended): asked without Done, which would make a channel
	// for a hold no one waits on.
	return h.lease.Err() != nil
}

// beginRelease and endRelease enclose a release of h (nil: none): a
// renewal that finds h gone meanwhile may have run after the release
// ended it, so the release's outcome, not the renewal, tells whether h
// was released or lost.
func (h *hold) beginRelease() {
	if h != nil {
		h.lease.Releasing(true)
	}
}

func (h *hold) endRelease() {
	if h != nil {
		h.lease.Releasing(false)
	}
}

func (h *hold) release() {
	h.released.Store(true)
	h.lease.Release()
}

// startHold begins renewing hold id, taken at start (see also
// Client.startHoldOf, for holds of cohort members).
func (c *Client) startHold(cfg *config, spec renew.Spec, id holdID, start time.Time) *hold {
	return c.renewHold(&hold{holdID: id, count: 1}, cfg, spec, start)
}

// renewHold begins renewing h, taken at start, as spec says, and returns
// h.
func (c *Client) renewHold(h *hold, cfg *config, spec renew.Spec, start time.Time) *hold {
	spec.TTL = cfg.ttl
	spec.Interval = cfg.interval
	spec.MaxHold = cfg.maxHold
	spec.Start = start
	h.lease = c.renew.Add(spec)
	return h
}
