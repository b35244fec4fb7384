package dsync

import (
	"reflect"
	"slices"
	"sync"
)

// A quorumLease is the lease of a quorum hold. Each master that granted the
// hold keeps a member hold of its own, renewed by its member Client; the
// quorum hold is lost as soon as fewer than a majority of them are alive
// (see Quorum.watch), and once it ends, released or lost, its member holds
// are no longer renewed.
type quorumLease struct {
	done chan struct{}
	more chan struct{} // (capacity 1) a re-entry added member holds
	subs []*hold       // the member holds, nil where a master did not grant

	mu    sync.Mutex
	ended bool
	lost  bool
	// levels[i] counts the levels of the hold (an owner's re-entries made
	// through this process) that master i granted: a re-entry granted by
	// another majority than the first call's counts on other masters.
	levels []int
}

// reenter counts a re-entry granted by the masters of a, starting a
// member hold (sub) on a master that had none.
func (l *quorumLease) reenter(a answers, sub func(i int) *hold) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	added := false
	for i := range l.levels {
		if a.err[i] == nil && a.v[i] > 0 {
			l.levels[i]++
			if l.subs[i] == nil {
				l.subs[i] = sub(i)
				added = true
			}
		}
	}
	if added {
		// The watcher counts the new member hold from now on.
		select {
		case l.more <- struct{}{}:
		default:
		}
	}
}

// levels returns how many levels of hold h this process counts (0 for
// none known).
func (q *Quorum) levels(h *hold) int {
	if h == nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return h.count
}

// unlockOn returns the masters an unlock of one of the count levels of
// its hold ends a level on: those that count more levels than are left.
// nil (every master) for the last level, or when l is not known here.
func (l *quorumLease) unlockOn(count, n int) []bool {
	if l == nil || count <= 1 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	send := make([]bool, n)
	for i := range send {
		send[i] = i < len(l.levels) && l.levels[i] > count-1
	}
	return send
}

// unlockedOn counts the reply v (error err) of master i to an unlock sent
// to the masters in send: one level less if it ended one there.
func (l *quorumLease) unlockedOn(send []bool, i int, v int64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if send[i] && i < len(l.levels) && err == nil && (v == 1 || v == 2) {
		l.levels[i]--
	}
}

var _ leaser = (*quorumLease)(nil)

func (l *quorumLease) Done() <-chan struct{} { return l.done }

func (l *quorumLease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost {
		return ErrLeaseLost
	}
	return nil
}

func (l *quorumLease) Release()  { l.end(false) }
func (l *quorumLease) MarkLost() { l.end(true) }

// Releasing marks the release as under way on each member hold, so that a
// member renewal that runs after the member's release does not count the
// member hold as lost before the release's outcome is known.
// (l.mu is held across, as watchCases holds it across the member holds'
// Done: the renewer takes no quorum lease's lock.)
func (l *quorumLease) Releasing(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.subs {
		if s != nil {
			s.lease.Releasing(on)
		}
	}
}

// end ends a live lease, lost or not, and stops renewing its member holds.
// Ending it not lost and not released is how Close ends it.
func (l *quorumLease) end(lost bool) {
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return
	}
	l.ended, l.lost = true, lost
	close(l.done)
	subs := slices.Clone(l.subs)
	l.mu.Unlock()
	for _, s := range subs {
		if s != nil {
			s.release()
		}
	}
}

// memberHold returns the member hold on master i of quorum hold h, nil if h
// is nil or master i did not grant it.
func memberHold(h *hold, i int) *hold {
	if h == nil {
		return nil
	}
	if l, ok := h.lease.(*quorumLease); ok && i < len(l.subs) {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.subs[i]
	}
	return nil
}

// noMemberArg names, in an unlock, a hold that no master has (fencing
// tokens start at 1, and a read hold's id is a call id).
const noMemberArg = "0"

// memberFence is what an unlock of h (nil: no hold recorded here) names
// on master i: h's member hold there, or, where h has none (the master
// did not count in its grant, whose attempts there were undone), a hold
// no master has, so that the unlock ends no later hold of the holder on
// that master however late it arrives. Without h, nothing.
func memberFence(h *hold, i int) any {
	if m := memberHold(h, i); m != nil {
		return m.fenceArg()
	}
	if h != nil {
		if _, ok := h.lease.(*quorumLease); ok {
			return noMemberArg
		}
	}
	return argNone
}

// hold makes the hold of a quorum grant a to holder tok: one member hold
// per granting master, started by sub(i), and the hold's own lease.
func (q *Quorum) hold(tok string, fence uint64, a answers, sub func(i int) *hold) *hold {
	l := &quorumLease{done: make(chan struct{}), more: make(chan struct{}, 1), subs: make([]*hold, len(a.v)), levels: make([]int, len(a.v))}
	for i := range l.subs {
		if a.err[i] == nil && a.v[i] > 0 {
			l.subs[i] = sub(i)
			l.levels[i] = 1
		}
	}
	q.watch(l)
	return &hold{holdID: holdID{tok: tok, fence: fence}, count: 1, lease: l}
}

// watch marks l lost when fewer than a majority of its member holds are
// alive, and ends it when the Quorum is closed. Member holds that a
// re-entry adds (see reenter) count from then on.
func (q *Quorum) watch(l *quorumLease) {
	q.watchMu.Lock()
	defer q.watchMu.Unlock()
	select {
	case <-q.closed:
		l.end(false)
		return
	default:
	}
	q.watched.Add(1)
	go func() {
		defer q.watched.Done()
		for {
			cases, alive := l.watchCases(q.closed)
			if alive < q.need {
				l.MarkLost()
				return
			}
			switch i, _, _ := reflect.Select(cases); i {
			case 0:
				return
			case 1:
				l.end(false)
				return
			}
			// A member hold ended, or one was added: count again.
		}
	}()
}

// watchCases returns what the watcher of l waits for: l's end, closed, a
// member hold added, and the end of each of its member holds still alive;
// and how many those are.
func (l *quorumLease) watchCases(closed chan struct{}) ([]reflect.SelectCase, int) {
	cases := []reflect.SelectCase{
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(l.done)},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(closed)},
		{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(l.more)},
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	alive := 0
	for _, s := range l.subs {
		if s == nil {
			continue
		}
		select {
		case <-s.lease.Done():
			continue
		default:
		}
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(s.lease.Done())})
		alive++
	}
	return cases, alive
}
