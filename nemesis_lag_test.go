package dsync_test

import (
	"sort"
	"sync"
	"time"
)

// The stalls of the test process itself. On a loaded machine (or under a
// stop-the-world pause, or while the process is descheduled) every
// goroutine of the process runs late at once: a call whose ctx ended then
// returns late although nothing in dsync held it. nemLag measures such
// stalls from the process's own point of view: a goroutine that asks to
// wake every nemLagTick records each wake-up that came at least nemLagMin
// late as a window in which the process could not run it. The deadline
// check excuses the part of an overrun that such windows cover, and no
// more: a call that returns late while the process runs is still late.
const (
	nemLagTick = 10 * time.Millisecond
	nemLagMin  = 20 * time.Millisecond
)

type nemLag struct {
	mu   sync.Mutex
	ws   []nemWindow // the stalls, in order
	max  time.Duration
	stop chan struct{}
	done chan struct{}
}

// startLag starts measuring; stop ends it.
func startLag() *nemLag {
	l := &nemLag{stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l
}

func (l *nemLag) run() {
	defer close(l.done)
	t := time.NewTicker(nemLagTick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-l.stop:
			// A stall that is still to be measured ends here.
			l.note(last, time.Now())
			return
		case <-t.C:
		}
		now := time.Now()
		l.note(last, now)
		last = now
	}
}

// note records a stall if the goroutine, last run at last, ran again only
// at now. The ticker drops ticks it could not deliver: the wake-up was due
// one tick after last.
func (l *nemLag) note(last, now time.Time) {
	if due := last.Add(nemLagTick); now.Sub(due) >= nemLagMin {
		l.mu.Lock()
		l.ws = append(l.ws, nemWindow{what: "process stall", proc: -1, start: due, end: now})
		l.max = max(l.max, now.Sub(due))
		l.mu.Unlock()
	}
}

// close stops measuring; the stalls measured until then are all recorded.
func (l *nemLag) close() {
	close(l.stop)
	<-l.done
}

// during returns how long the process was measured stalled between from
// and to.
func (l *nemLag) during(from, to time.Time) time.Duration {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var sum time.Duration
	// The windows follow one another: their ends rise too.
	i := sort.Search(len(l.ws), func(i int) bool { return l.ws[i].end.After(from) })
	for _, w := range l.ws[i:] {
		if !w.start.Before(to) {
			break
		}
		s, e := w.start, w.end
		if s.Before(from) {
			s = from
		}
		if e.After(to) {
			e = to
		}
		if e.After(s) {
			sum += e.Sub(s)
		}
	}
	return sum
}

// longest returns the longest stall measured.
func (l *nemLag) longest() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.max
}
