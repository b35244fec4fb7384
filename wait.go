package dsync

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Waiting. A waiter never polls at a fixed interval: it sleeps until a
// notification on its primitive's channel, or until the time the failed
// attempt said the current hold (or queue place) lasts at most.
//
// One pub/sub connection per Client carries the channels of every name that
// has waiters; a channel stays subscribed for a short while after its last
// waiter leaves, so a busy name does not subscribe again for every wait.
//
// On Redis Cluster the scripts keep plain PUBLISH, which the cluster
// forwards to every node, so the one subscription connection may sit on any
// node. Sharded pub/sub (SPUBLISH/SSUBSCRIBE, Redis 7) would keep a release
// within its shard, but go-redis binds a sharded PubSub to the slot of its
// first channel and resubscribes all its channels in one SSUBSCRIBE, which
// the server rejects (CROSSSLOT) once they span slots: it would take one
// connection per waited-for slot, not one per Client, plus its own handling
// of slot moves, and miniredis has no SPUBLISH. Measured on a local
// 3-master cluster (BenchmarkClusterNotify): PUBLISH delivers in about
// 0.2 ms and costs 2 cluster-bus messages (N-1 for N nodes), SPUBLISH about
// 0.06 ms and none; a whole wake-up (release, notification, acquire) takes
// about 0.6 ms either way, and a release publishes only when someone waits.
// The broadcast matters on large clusters with many contended names.

const (
	// subscribeWait bounds how long a waiter waits for its channel's
	// subscription to be confirmed; past it, the waiter relies on its TTL
	// fallback alone.
	subscribeWait = 2 * time.Second
	// linger is how long a channel stays subscribed without waiters.
	linger = 5 * time.Second
)

type notifier struct {
	rdb redis.UniversalClient

	mu      sync.Mutex
	ps      *redis.PubSub
	chans   map[string]*channel
	pending map[string]int // SUBSCRIBEs sent and not yet confirmed
	closed  bool
	done    chan struct{} // closed when the receiver exits
	stop    chan struct{}
}

type channel struct {
	watchers  map[*watcher]struct{}
	ready     chan struct{} // closed once the subscription is confirmed
	confirmed bool
	idle      time.Time // when the last watcher left

	// What was delivered, so that a waiter that registers after an attempt
	// can tell whether it missed something since it sent the attempt (see
	// mark): seq counts the notifications, retried is the seq of the last
	// plain release or resubscription, handed the last hand-overs.
	seq     uint64
	retried uint64
	handed  [handedKept]handedMsg
}

// handedKept is how many hand-overs a channel remembers for waiters that
// register late.
const handedKept = 8

type handedMsg struct {
	seq     uint64
	payload string
}

// A mark is what a channel had delivered at one moment, taken before an
// attempt is sent.
type mark struct {
	ch  *channel // nil: the name was not subscribed then
	seq uint64
}

// A watcher is one waiter's interest in a channel.
type watcher struct {
	name  string
	tok   string
	ready chan struct{}
	sig   chan struct{} // a release, a hand-over or a resubscription happened

	mu     sync.Mutex
	handed string // the payload of a hand-over to tok, once seen
	retry  bool   // a plain release or a resubscription since the last look
}

func newNotifier(rdb redis.UniversalClient) *notifier {
	return &notifier{
		rdb:     rdb,
		chans:   make(map[string]*channel),
		pending: make(map[string]int),
		stop:    make(chan struct{}),
	}
}

// mark notes what channel name has delivered so far, if it is subscribed.
// Taken before an attempt is sent and handed to watch after the attempt
// failed, it spares the waiter a second attempt when nothing that concerns
// it was delivered in between.
func (n *notifier) mark(name string) mark {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ch := n.chans[name]; ch != nil && ch.confirmed {
		return mark{ch: ch, seq: ch.seq}
	}
	return mark{}
}

// watch registers interest in channel name for a waiter with owner token
// tok. The caller must call unwatch.
func (n *notifier) watch(name, tok string) *watcher {
	w, _ := n.watchSince(name, tok, mark{})
	return w
}

// watchSince is watch for a waiter that took mk before its last attempt.
// It reports whether the waiter must try again at once: unless since mk
// the channel stayed subscribed and delivered no plain release,
// resubscription or hand-over to tok (a hand-over to tok is passed on to
// the watcher), a notification may have been missed.
func (n *notifier) watchSince(name, tok string, mk mark) (*watcher, bool) {
	w := &watcher{name: name, tok: tok, sig: make(chan struct{}, 1)}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		w.ready = closedChan
		return w, true
	}
	if n.ps == nil {
		n.ps = n.rdb.Subscribe(context.Background())
		n.done = make(chan struct{})
		go n.receive(n.ps)
	}
	ch := n.chans[name]
	if ch == nil {
		ch = &channel{watchers: make(map[*watcher]struct{}), ready: make(chan struct{})}
		n.chans[name] = ch
		ctx, cancel := context.WithTimeout(context.Background(), subscribeWait)
		// go-redis keeps the channel even if sending SUBSCRIBE failed and
		// subscribes it again when it reconnects: a confirmation follows
		// either way.
		_ = n.ps.Subscribe(ctx, name)
		n.pending[name]++
		cancel()
	}
	ch.watchers[w] = struct{}{}
	w.ready = ch.ready
	return w, ch.missed(w, mk)
}

// missed reports whether w may have missed a notification since mk (see
// watch), and passes on a hand-over to w delivered since.
func (ch *channel) missed(w *watcher, mk mark) bool {
	if mk.ch != ch || !ch.confirmed || ch.retried > mk.seq {
		return true
	}
	if ch.seq-mk.seq > handedKept {
		return true // more hand-overs than remembered
	}
	for _, h := range ch.handed {
		if h.seq > mk.seq {
			if to, _ := splitHandover(h.payload); to == w.tok {
				w.mu.Lock()
				w.handed = h.payload
				w.mu.Unlock()
				w.signal()
			}
		}
	}
	return false
}

func (n *notifier) unwatch(w *watcher) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ch := n.chans[w.name]; ch != nil {
		delete(ch.watchers, w)
		if len(ch.watchers) == 0 {
			ch.idle = time.Now()
		}
	}
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// receive delivers the pub/sub's messages to watchers until it closes. It
// reads the connection itself, so that a notification reaches its waiter
// with one goroutine switch (go-redis's Channel adds two: its reader and
// its health check). A connection quiet for linger is pinged: go-redis
// reconnects and subscribes again when that fails. Idle channels are swept
// every linger.
func (n *notifier) receive(ps *redis.PubSub) {
	defer close(n.done)
	ctx := context.Background()
	lastSweep := time.Now()
	var failed int
	for {
		m, err := ps.ReceiveTimeout(ctx, linger)
		select {
		case <-n.stop:
			return
		default:
		}
		switch {
		case err == nil:
			failed = 0
			n.deliver(m)
		case errors.Is(err, redis.ErrClosed):
			return
		case isTimeout(err):
			pctx, cancel := context.WithTimeout(ctx, subscribeWait)
			_ = ps.Ping(pctx)
			cancel()
		default:
			// go-redis has dropped the connection and dials a new one on the
			// next call; back off if that keeps failing.
			failed++
			if failed > 1 {
				select {
				case <-n.stop:
					return
				case <-time.After(min(time.Duration(failed)*50*time.Millisecond, time.Second)):
				}
			}
		}
		if time.Since(lastSweep) >= linger {
			n.sweep()
			lastSweep = time.Now()
		}
	}
}

// isTimeout reports whether err is a read timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (n *notifier) deliver(m any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch m := m.(type) {
	case *redis.Subscription:
		if m.Kind != "subscribe" && m.Kind != "ssubscribe" {
			return
		}
		ch := n.chans[m.Channel]
		if p := n.pending[m.Channel]; p > 0 {
			if p == 1 {
				delete(n.pending, m.Channel)
				if ch != nil && !ch.confirmed {
					ch.confirmed = true
					close(ch.ready)
				}
			} else {
				n.pending[m.Channel] = p - 1
			}
			return
		}
		// Resubscribed after a reconnect: releases may have been missed, so
		// every waiter tries again.
		if ch != nil && !ch.confirmed {
			ch.confirmed = true
			close(ch.ready)
		}
		if ch != nil {
			ch.seq++
			ch.retried = ch.seq
			for w := range ch.watchers {
				w.mu.Lock()
				w.retry = true
				w.mu.Unlock()
				w.signal()
			}
		}
	case *redis.Message:
		ch := n.chans[m.Channel]
		if ch == nil {
			return
		}
		// A plain release wakes every waiter; a hand-over only the waiter
		// it went to (the others have no reason to look: the lock is held
		// again, and their timers keep running).
		to, _ := splitHandover(m.Payload)
		ch.seq++
		if to == "" {
			ch.retried = ch.seq
		} else {
			ch.handed[ch.seq%handedKept] = handedMsg{seq: ch.seq, payload: m.Payload}
		}
		for w := range ch.watchers {
			if to != "" && to != w.tok {
				continue
			}
			w.mu.Lock()
			if to == "" {
				w.retry = true
			} else {
				w.handed = m.Payload
			}
			w.mu.Unlock()
			w.signal()
		}
	}
}

// sweep unsubscribes channels that have had no watchers for a while.
func (n *notifier) sweep() {
	n.mu.Lock()
	defer n.mu.Unlock()
	var names []string
	for name, ch := range n.chans {
		if len(ch.watchers) == 0 && time.Since(ch.idle) >= linger {
			names = append(names, name)
			delete(n.chans, name)
		}
	}
	if len(names) > 0 && n.ps != nil {
		ctx, cancel := context.WithTimeout(context.Background(), subscribeWait)
		_ = n.ps.Unsubscribe(ctx, names...)
		cancel()
	}
}

func (n *notifier) close() {
	n.mu.Lock()
	n.closed = true
	ps, done := n.ps, n.done
	for _, ch := range n.chans {
		for w := range ch.watchers {
			w.signal()
		}
	}
	n.mu.Unlock()
	close(n.stop)
	if ps != nil {
		_ = ps.Close()
		<-done
	}
}

func (w *watcher) signal() {
	select {
	case w.sig <- struct{}{}:
	default:
	}
}

// handover returns the fencing token of a hold handed to this waiter, if a
// hand-over was seen.
func (w *watcher) handover() (uint64, bool) {
	w.mu.Lock()
	p := w.handed
	w.mu.Unlock()
	if p == "" {
		return 0, false
	}
	_, f := splitHandover(p)
	return f, f > 0
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

// splitHandover parses "<owner token> <fencing token>"; a plain release is "".
func splitHandover(p string) (string, uint64) {
	i := strings.LastIndexByte(p, ' ')
	if i < 0 {
		return "", 0
	}
	f, err := strconv.ParseUint(p[i+1:], 10, 64)
	if err != nil {
		return "", 0
	}
	return p[:i], f
}

// awaitReady waits, boundedly, until w's channel is subscribed, so that a
// release after the next attempt cannot be missed.
func (w *watcher) awaitReady(ctx context.Context, closed <-chan struct{}) {
	select {
	case <-w.ready:
		return
	default:
	}
	t := time.NewTimer(subscribeWait)
	defer t.Stop()
	select {
	case <-w.ready:
	case <-t.C:
	case <-ctx.Done():
	case <-closed:
	}
}
