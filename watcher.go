package dsync

import (
	"context"
	"sync"
)

// Watchers: one waiting call's interest in a channel, as the notifier
// (wait.go) delivers to it and the engine (engine.go) reads it.

// A watcher is one waiter's interest in a channel. Watchers are recycled
// (see watchers): one must not be used after unwatch.
type watcher struct {
	name   string
	to     addressee // zero: the waiter accepts no hand-over, only wakes
	holder sum       // the digest of to.tok, if set
	ready  chan struct{}
	sig    chan struct{} // a release, a hand-over or a resubscription happened

	mu     sync.Mutex
	handed uint64 // the fencing token of a proven hand-over to this call
	retry  bool   // a reason to try again since the last look
}

// watchers recycles watchers: a contended call waits once or more, and a
// watcher with its signal channel is two allocations.
var watchers sync.Pool

// newWatcher returns a watcher of channel name for the call to, not yet
// registered.
func newWatcher(name string, to addressee) *watcher {
	w, _ := watchers.Get().(*watcher)
	if w == nil {
		w = &watcher{sig: make(chan struct{}, 1)}
	}
	select {
	case <-w.sig: // a signal left from its last use
	default:
	}
	w.name, w.to, w.ready = name, to, nil
	w.handed, w.retry = 0, false
	w.holder = sum{}
	if to.tok != "" {
		// Made only for a call that waits: a hand-over to another call of
		// its holder wakes it.
		w.holder = holderSum(to.tok)
	}
	return w
}

// wake gives w a reason to try again (see shouldRetry) and signals it.
func (w *watcher) wake() {
	w.mu.Lock()
	w.retry = true
	w.mu.Unlock()
	w.signal()
}

func (w *watcher) signal() {
	select {
	case w.sig <- struct{}{}:
	default:
	}
}

// handover returns the fencing token of a hold handed to this waiter, if a
// proven hand-over was seen since the last call, and forgets it.
func (w *watcher) handover() (uint64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f := w.handed
	w.handed = 0
	return f, f > 0
}

// offer passes w a hand-over message h and reports whether it asks w to
// retry (a proven hand-over to w is passed on instead). A hand-over to w's
// call counts only with the proof that a script sent it (see lua/lib.lua);
// one to another call of w's holder asks w to try again (it re-enters), as
// does a message that names w's call without a valid proof: a notification
// can wake a waiter, never grant it a hold.
func (w *watcher) offer(h handover) bool {
	if w.to.id == "" {
		// A waiter that takes no hand-overs: any message may free the name.
		w.wake()
		return true
	}
	switch {
	case h.ok && h.id == w.to.id && h.f > 0 && h.f < maxFence && proofSum(w.to.secret, h.f).is(h.proof):
		w.mu.Lock()
		w.handed = h.f
		w.mu.Unlock()
		w.signal()
		return false
	case h.id == w.to.id || (h.ok && w.to.tok != "" && w.holder.is(h.holder)):
		w.wake()
		return true
	}
	return false
}

// shouldRetry reports whether, since it was last asked, a plain release or
// a resubscription (after which releases may have been missed) was seen:
// reasons for a waiter to try again. A hand-over to another waiter is not.
func (w *watcher) shouldRetry() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.retry
	w.retry = false
	return r
}

// awaitReady waits, boundedly, until w's channel is subscribed, so that a
// release after the next attempt cannot be missed.
func (w *watcher) awaitReady(ctx context.Context, closed <-chan struct{}) {
	select {
	case <-w.ready:
		return
	default:
	}
	t := getTimer(subscribeWait)
	defer putTimer(t)
	select {
	case <-w.ready:
	case <-t.C:
	case <-ctx.Done():
	case <-closed:
	}
}
