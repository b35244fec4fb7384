package dsync

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Waiting. A waiter never polls at a fixed interval: it sleeps until a
// notification on its primitive's channel, or until the time the failed
// attempt said the current hold (or queue place) lasts at most.
//
// One pub/sub connection per Client (on a Redis Cluster, one per master
// with waiters: see link) carries the channels of every name that has
// waiters; a channel stays subscribed for a short while after its last
// waiter leaves, so a busy name does not subscribe again for every wait.
//
// On Redis Cluster the scripts keep plain PUBLISH, which the cluster
// forwards to every node. Sharded pub/sub (SPUBLISH/SSUBSCRIBE, Redis 7)
// would keep a release within its shard, but go-redis binds a sharded
// PubSub to the slot of its first channel and resubscribes all its
// channels in one SSUBSCRIBE, which the server rejects (CROSSSLOT) once
// they span slots: it would take one connection per waited-for slot, not
// one per master, plus its own handling
// of slot moves, and miniredis has no SPUBLISH. Measured on a local
// 3-master cluster (BenchmarkClusterNotify): PUBLISH delivers in about
// 0.2 ms and costs 2 cluster-bus messages (N-1 for N nodes), SPUBLISH about
// 0.06 ms and none; a whole wake-up (release, notification, acquire) takes
// about 0.6 ms either way, and a release publishes only when someone waits.
// The broadcast matters on large clusters with many contended names. What
// matters on every cluster is that a forwarded PUBLISH can be held about
// 40 ms by the bus (see Links below): channels are subscribed on their
// names' masters.
//
// A hand-over concerns the Client of the call it goes to, and through the
// holder digest it carries, the other waiting calls of that holder. A call
// without an owner has a holder token that no call of another Client
// holds, so the hand-over to it is published on its Client's own channel
// of the name, the name's channel plus the Client's inbox suffix (see
// lua/lib.lua's publish_handover): the other Clients waiting on the name
// neither receive nor parse it. A Client subscribes both channels of a
// name together, and a channel counts as subscribed once both are.

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
	// inbox is "@" and a random id of this notifier: a name's channel
	// plus inbox is the Client's own channel of the name.
	inbox string

	mu sync.Mutex
	// The pub/sub connections, by the address of the master whose slots
	// their channels hash to on a Redis Cluster ("" elsewhere: one
	// connection). See links.
	links   map[string]*redis.PubSub
	started bool // the sender runs
	chans   map[string]*channel
	pending map[string]int // SUBSCRIBEs sent and not yet confirmed
	closed  bool
	stop    chan struct{}
	subs    sync.WaitGroup // the sender of ops (see send)
	recvs   sync.WaitGroup // the receivers, one per link (see receive)
	ops     []subOp        // SUBSCRIBEs and UNSUBSCRIBEs to send, in order
	opsSet  chan struct{}  // a value when ops has something

	// Tests only: called with each message before it is delivered, on
	// the receiving goroutine (it may hold the message back).
	onMessage atomic.Pointer[func(*redis.Message)]
}

type channel struct {
	watchers    map[*watcher]struct{}
	ready       chan struct{} // closed once the subscription is confirmed
	confirmed   bool
	unconfirmed int       // subscriptions (the name's, the inbox) not yet confirmed
	idle        time.Time // when the last watcher left

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
	seq uint64
	h   handover
}

// A mark is what a channel had delivered at one moment, taken before an
// attempt is sent.
type mark struct {
	ch  *channel // nil: the name was not subscribed then
	seq uint64
}

func newNotifier(rdb redis.UniversalClient) *notifier {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return &notifier{
		rdb:     rdb,
		inbox:   "@" + hex.EncodeToString(b[:]),
		links:   make(map[string]*redis.PubSub),
		chans:   make(map[string]*channel),
		pending: make(map[string]int),
		stop:    make(chan struct{}),
		opsSet:  make(chan struct{}, 1),
	}
}

// A subOp is a SUBSCRIBE (or UNSUBSCRIBE, unsub) of channels, queued under
// n.mu and sent by send.
type subOp struct {
	unsub bool
	names []string
}

// queue adds a SUBSCRIBE or UNSUBSCRIBE of names to the ops send sends;
// n.mu is held. They go out in the order queued: an UNSUBSCRIBE of a swept
// channel before the SUBSCRIBE of a waiter that watches it again.
func (n *notifier) queue(unsub bool, names ...string) {
	n.ops = append(n.ops, subOp{unsub: unsub, names: names})
	select {
	case n.opsSet <- struct{}{}:
	default:
	}
}

// Links. On a Redis Cluster a PUBLISH reaches the subscribers of other
// nodes over the cluster bus, and Redis (7.0 at least) sends bus messages
// on connections without TCP_NODELAY: a notification that follows another
// small bus message can wait for the receiving node's delayed ACK, about
// 40 ms (see docs/scaling.md). So a channel is subscribed on a connection
// to the master whose slots its name hashes to, where the release script
// that publishes on it runs: one pub/sub connection per master with
// subscribed channels. go-redis connects a cluster pub/sub to the master
// of its first channel's slot, also when it reconnects (with its channels
// then), so a link follows its master through a failover; after a slot
// moved, its channels are delivered over the bus as before.

// linkOf returns the address of the master whose slots name hashes to on a
// Redis Cluster, "" elsewhere or when it is not known.
func (n *notifier) linkOf(ctx context.Context, name string) string {
	cc, ok := n.rdb.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	m, err := cc.MasterForKey(ctx, name)
	if err != nil {
		return ""
	}
	return m.Options().Addr
}

// link returns the pub/sub connection for address addr (see linkOf), made
// if need be, or nil once n is closed. Its receiver is started by send,
// after the first SUBSCRIBE on it: a receive before that would connect
// the pub/sub to any node.
func (n *notifier) link(addr string) (ps *redis.PubSub, made bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, false
	}
	if ps = n.links[addr]; ps != nil {
		return ps, false
	}
	ps = n.rdb.Subscribe(context.Background())
	n.links[addr] = ps
	return ps, true
}

// startReceiver starts the receiver of ps, unless n is closed.
func (n *notifier) startReceiver(ps *redis.PubSub) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	n.recvs.Add(1)
	go n.receive(ps)
}

// send sends the queued ops until n is closed, merging neighbours of one
// kind into one command per link. It runs on a goroutine of its own, never
// under n.mu: on a connection that is slow to come up (a dial, a handshake
// the server is slow to answer) a command waits up to subscribeWait, and
// n.mu must not wait with it, or every waiter of the Client would (see
// watchSince, unwatch). go-redis keeps the channels even if sending
// SUBSCRIBE failed and subscribes them again when it reconnects:
// confirmations follow either way.
func (n *notifier) send() {
	defer n.subs.Done()
	on := make(map[string]*redis.PubSub) // where each channel was subscribed
	for {
		select {
		case <-n.stop:
			return
		case <-n.opsSet:
		}
		n.mu.Lock()
		ops := n.ops
		n.ops = nil
		n.mu.Unlock()
		for i := 0; i < len(ops); {
			op := ops[i]
			for i++; i < len(ops) && ops[i].unsub == op.unsub; i++ {
				op.names = append(op.names, ops[i].names...)
			}
			ctx, cancel := context.WithTimeout(context.Background(), subscribeWait)
			n.sendOp(ctx, op, on)
			cancel()
		}
	}
}

// sendOp sends op on the links of its channels; on records the link each
// channel is subscribed on.
func (n *notifier) sendOp(ctx context.Context, op subOp, on map[string]*redis.PubSub) {
	if op.unsub {
		// Rare (sweeps): grouped by link.
		by := make(map[*redis.PubSub][]string)
		for _, name := range op.names {
			if ps := on[name]; ps != nil {
				by[ps] = append(by[ps], name)
				delete(on, name)
			}
		}
		for ps, names := range by {
			_ = ps.Unsubscribe(ctx, names...)
		}
		return
	}
	if _, ok := n.rdb.(*redis.ClusterClient); !ok {
		n.subscribe(ctx, "", op.names, on)
		return
	}
	by := make(map[string][]string)
	for _, name := range op.names {
		addr := n.linkOf(ctx, name)
		by[addr] = append(by[addr], name)
	}
	for addr, names := range by {
		if !n.subscribe(ctx, addr, names, on) {
			return
		}
	}
}

// subscribe subscribes names on the link for addr, made (and its receiver
// started) if need be; it reports false, sending nothing, once n is
// closed.
func (n *notifier) subscribe(ctx context.Context, addr string, names []string, on map[string]*redis.PubSub) bool {
	ps, made := n.link(addr)
	if ps == nil {
		return false
	}
	for _, name := range names {
		on[name] = ps
	}
	_ = ps.Subscribe(ctx, names...)
	if made {
		n.startReceiver(ps)
	}
	return true
}

// inboxFor returns the inbox suffix that a call's secret carries (see
// newAddressee): n's for a call without an owner, whose holder token no
// other Client's calls hold, "" for a call with one (owned), whose holder
// may have calls waiting in other Clients.
func (n *notifier) inboxFor(owned bool) string {
	if n == nil || owned {
		return ""
	}
	return n.inbox
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

// watch registers interest in channel name for a waiter that accepts no
// hand-overs: every release wakes it. The caller must call unwatch.
func (n *notifier) watch(name string) *watcher {
	w, _ := n.watchSince(name, addressee{}, mark{})
	return w
}

// watchSince is watch for a waiter that took mk before its last attempt.
// It reports whether the waiter must try again at once: unless since mk
// the channel stayed subscribed and delivered no plain release,
// resubscription or hand-over that concerns to (one is passed on to the
// watcher), a notification may have been missed.
func (n *notifier) watchSince(name string, to addressee, mk mark) (*watcher, bool) {
	w := newWatcher(name, to)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		w.ready = closedChan
		return w, true
	}
	if !n.started {
		n.started = true
		n.subs.Add(1)
		go n.send()
	}
	ch := n.chans[name]
	if ch == nil {
		// The name's channel and the Client's own channel of the name map
		// to the same channel: they are subscribed, delivered and swept
		// together.
		own := name + n.inbox
		ch = &channel{watchers: make(map[*watcher]struct{}), ready: make(chan struct{}), unconfirmed: 2}
		n.chans[name], n.chans[own] = ch, ch
		n.pending[name]++
		n.pending[own]++
		// SUBSCRIBE is sent in the background (see send); the waiter waits
		// for the confirmation (see awaitReady), bounded by its ctx.
		n.queue(false, name, own)
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
	retry := false
	for _, m := range ch.handed {
		if m.seq > mk.seq && w.offer(m.h) {
			retry = true
		}
	}
	return retry
}

// unwatch ends w's interest in its channel; w must not be used after.
func (n *notifier) unwatch(w *watcher) {
	n.mu.Lock()
	if ch := n.chans[w.name]; ch != nil {
		delete(ch.watchers, w)
		if len(ch.watchers) == 0 {
			ch.idle = time.Now()
		}
	}
	n.mu.Unlock()
	// Nothing delivers to w any more: the notifier reaches watchers only
	// through its channels' sets, under n.mu.
	watchers.Put(w)
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// receive delivers the pub/sub's messages to watchers until it closes. It
// reads the connection itself, so that a notification reaches its waiter
// with one goroutine switch (go-redis's Channel adds two: its reader and
// its health check). A connection quiet for linger is pinged: go-redis
// reconnects and subscribes again when that fails. Idle channels are swept
// every linger.
func (n *notifier) receive(ps *redis.PubSub) {
	defer n.recvs.Done()
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
			if f := n.onMessage.Load(); f != nil {
				if msg, ok := m.(*redis.Message); ok {
					(*f)(msg)
				}
			}
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
					ch.unconfirmed--
					if ch.unconfirmed <= 0 {
						ch.confirmed = true
						close(ch.ready)
					}
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
				w.wake()
			}
		}
	case *redis.Message:
		ch := n.chans[m.Channel]
		if ch == nil {
			return
		}
		// A plain release wakes every waiter; a hand-over only the call
		// it went to and the other calls of the same holder (the others
		// have no reason to look: the lock is held again, and their timers
		// keep running).
		ch.seq++
		var h handover
		if m.Payload == "" {
			ch.retried = ch.seq
		} else {
			h = parseHandover(m.Payload)
			ch.handed[ch.seq%handedKept] = handedMsg{seq: ch.seq, h: h}
		}
		for w := range ch.watchers {
			if m.Payload == "" {
				w.wake()
				continue
			}
			w.offer(h)
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
	if len(names) > 0 {
		n.queue(true, names...)
	}
}

// closeWithin is close, but waits at most d for the pub/sub connections to
// close and the goroutines to end: a SUBSCRIBE or PING the server holds
// (on a connection still coming up, say) holds its PubSub's lock, and its
// Close with it, until go-redis gives up on it (its ReadTimeout, or never
// with none). The rest then ends in the background when go-redis does. It
// reports whether all had ended.
func (n *notifier) closeWithin(d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.close()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

func (n *notifier) close() {
	n.mu.Lock()
	n.closed = true
	links := make([]*redis.PubSub, 0, len(n.links))
	for _, ps := range n.links {
		links = append(links, ps)
	}
	for _, ch := range n.chans {
		for w := range ch.watchers {
			w.signal()
		}
	}
	n.mu.Unlock()
	// No link is made once closed is set, and no receiver started.
	close(n.stop)
	for _, ps := range links {
		_ = ps.Close()
	}
	n.subs.Wait()
	n.recvs.Wait()
}
