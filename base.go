package dsync

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// The base of the Client and the Quorum, and the handle every primitive
// keeps of how it was made (see lease.go and reentry.go for the holds).

// A base is what a [Client] and a [Quorum] share, and what the Mutex and
// RWMutex handles they make rely on whichever of the two made them: the
// defaults of the handles, the bad input every call reports, the closed
// state, and the holds of owners carried in ctx.
type base struct {
	cfg    config
	err    error // bad input to the constructor, reported by every call
	closed chan struct{}
	mu     sync.Mutex
	holds  map[holdKey]*hold // holds of owners carried in ctx
	calls  map[holdKey]*callWatch
	// Levels (permits) of owners' holds that ended on record here while
	// their goroutines still had releases to make (see owe).
	owed      map[holdKey]*owedLevels
	owedSwept time.Time
	// Owners with a call that takes a hold in flight here (see
	// ownerFlight).
	ownerFlights map[holdKey]ownerFlight
	// Tests: called when a lock call starts waiting for a release (enter).
	onWait atomic.Pointer[func()]
	// Releases whose caller's ctx ended first (see settle).
	releases tasks

	// id tells this Client's holds apart from other processes' with the
	// same owner token, under client reentrancy (see holderToken).
	id string
}

// init sets b up with opts over the default options.
func (b *base) init(opts []Option) {
	b.cfg = defaultConfig()
	b.cfg.apply(opts)
	b.err = b.cfg.err
	b.closed = make(chan struct{})
	b.holds = make(map[holdKey]*hold)
	b.calls = make(map[holdKey]*callWatch)
	b.owed = make(map[holdKey]*owedLevels)
	b.ownerFlights = make(map[holdKey]ownerFlight)
	b.id = newCallID()
}

// check returns the error every call through b reports, if any: b is nil
// (a handle made by a nil Client or Quorum), was not made by New or
// NewQuorum (a zero Client or Quorum), had bad input, or is closed.
func (b *base) check() error {
	if b == nil {
		return fmt.Errorf("%w: nil client", ErrInvalid)
	}
	if b.closed == nil {
		return fmt.Errorf("%w: a client not made by New or NewQuorum", ErrInvalid)
	}
	if b.err != nil {
		return b.err
	}
	select {
	case <-b.closed:
		return ErrClosed
	default:
		return nil
	}
}

// A handle is what the handle of every primitive keeps of how it was
// made: what the Client or Quorum that made it shares with it (nil if
// that was nil), its configuration, and the bad input every call on it
// reports.
type handle struct {
	b   *base
	cfg config
	err error
}

// newHandle returns the handle of a primitive called name made through b
// (which may be nil) with opts.
func (b *base) newHandle(name string, opts []Option) handle {
	h := handle{b: b}
	h.cfg, h.err = b.handleConfig(name, opts)
	return h
}

// check returns the error every call on the handle reports, if any: that
// of its base (see base.check), else its bad input.
func (h *handle) check() error {
	if err := h.b.check(); err != nil {
		return err
	}
	return h.err
}

// handleConfig returns the configuration of a primitive called name made
// through b (which may be nil) with opts, and the bad-input error every call
// on it reports, if any.
func (b *base) handleConfig(name string, opts []Option) (config, error) {
	cfg := defaultConfig()
	if b != nil {
		cfg = b.cfg
	}
	cfg.err = nil
	cfg.apply(opts)
	err := cfg.err
	if name == "" {
		err = fmt.Errorf("%w: empty name", ErrInvalid)
	}
	return cfg, err
}

// leaseOf returns the lease of the hold a Lease call finds through a
// handle: the hold of ctx's owner, recorded under key, or without an owner
// the handle's own, mine(). It returns ErrNotHeld if there is none.
func (b *base) leaseOf(ctx context.Context, key string, mine func() *hold) (*Lease, error) {
	tok, owned, err := owner(ctx)
	if err != nil {
		return nil, err
	}
	var h *hold
	if owned {
		h = b.lookupHold(holdKey{key, tok})
	} else {
		h = mine()
	}
	if h == nil {
		return nil, ErrNotHeld
	}
	return h.leaseView(), nil
}

// holderToken is the token under which owner tok holds in Redis: tok
// itself with script reentrancy, so that a token carried to another
// process re-enters there; with client reentrancy, tok qualified by this
// Client, so that a carried token waits there like any other owner (the
// count lives in one process).
func (b *base) holderToken(cfg *config, tok string) string {
	if cfg.local {
		return tok + "@" + b.id
	}
	return tok
}
