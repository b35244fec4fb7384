package dsync

import (
	"context"
	"sync"
)

// Slots: where a handle keeps the hold it took without an owner in ctx.

// A slot is where a handle keeps the hold it took without an owner in ctx.
// Like a sync.Mutex value, the handle is locked from the Lock that filled
// the slot until the Unlock that empties it, also when the hold was lost
// meanwhile: a gate, taken by Lock and given back by Unlock (or by a Lock
// that failed), makes a second Lock through the handle wait.
type slot struct {
	gate chan struct{} // holds a value while the handle is locked
	mu   sync.Mutex
	cur  *hold
}

func newSlot() slot { return slot{gate: make(chan struct{}, 1)} }

// enter locks the handle's gate, waiting with wait, and reports whether it
// did.
func (s *slot) enter(ctx context.Context, wait bool, closed <-chan struct{}) (bool, error) {
	select {
	case s.gate <- struct{}{}:
		return true, nil
	default:
	}
	if !wait {
		return false, nil
	}
	select {
	case s.gate <- struct{}{}:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	case <-closed:
		return false, ErrClosed
	}
}

// leave unlocks the handle's gate.
func (s *slot) leave() { <-s.gate }

func (s *slot) set(h *hold) {
	s.mu.Lock()
	s.cur = h
	s.mu.Unlock()
}

// clear empties the slot if it holds h, and reports whether it did.
func (s *slot) clear(h *hold) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != h {
		return false
	}
	s.cur = nil
	return true
}

func (s *slot) get() *hold {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}
