package dsync

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/internal/redistest"
)

// TestWatchSinceMark checks when a waiter that registers after its first
// attempt must try again: only if, since the mark taken before the attempt,
// the channel was not subscribed, or delivered a plain release, a
// resubscription or more hand-overs than it remembers; a hand-over to the
// waiter itself is passed on.
func TestWatchSinceMark(t *testing.T) {
	n := newNotifier(redistest.Miniredis(t).NewClient(t))
	t.Cleanup(n.close)
	const name = "chan"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Subscribe the channel and wait for the confirmation.
	first := n.watch(name)
	first.awaitReady(ctx, nil)
	select {
	case <-first.ready:
	default:
		t.Fatal("channel not subscribed")
	}
	n.unwatch(first)

	msg := func(payload string) { n.deliver(&redis.Message{Channel: name, Payload: payload}) }
	// The Client's own channel of the name (see notifier.inbox).
	own := func(payload string) { n.deliver(&redis.Message{Channel: name + n.inbox, Payload: payload}) }
	me := newAddressee("holder", "me", n.inbox)
	// handover is what a script publishes when it hands the lock to call id
	// of holder tok, whose secret is secret (see lua/lib.lua).
	handover := func(id, tok, secret string, f uint64) string {
		fs := strconv.FormatUint(f, 10)
		return id + " " + digest(tok) + " " + fs + " " + digest(secret+" "+fs)
	}
	cases := []struct {
		name   string
		mk     func() mark
		send   func()
		retry  bool
		handed uint64
	}{
		{"nothing delivered", func() mark { return n.mark(name) }, func() {}, false, 0},
		{"plain release", func() mark { return n.mark(name) }, func() { msg("") }, true, 0},
		{"hand-over to another", func() mark { return n.mark(name) }, func() { msg(handover("other", "someone", "s", 7)) }, false, 0},
		{"hand-over to the waiter", func() mark { return n.mark(name) }, func() {
			msg(handover("other", "someone", "s", 7))
			msg(handover("me", "holder", me.secret, 9))
			msg(handover("x", "someone", "s", 11))
		}, false, 9},
		{"hand-over to the waiter on the Client's own channel", func() mark { return n.mark(name) }, func() {
			own(handover("other", "someone", "s", 7))
			own(handover("me", "holder", me.secret, 9))
		}, false, 9},
		{"hand-over proved without the inbox", func() mark { return n.mark(name) }, func() {
			own(handover("me", "holder", strings.TrimSuffix(me.secret, n.inbox), 9))
		}, true, 0},
		{"plain release on the Client's own channel", func() mark { return n.mark(name) }, func() { own("") }, true, 0},
		{"forged hand-over to the waiter", func() mark { return n.mark(name) }, func() {
			msg(handover("me", "holder", "guessed", 424242))
			msg("me " + digest("holder") + " 9223372036854775808 x")
			msg("me 42")
		}, true, 0},
		{"hand-over to another call of the holder", func() mark { return n.mark(name) }, func() {
			msg(handover("sibling", "holder", "s", 7))
		}, true, 0},
		{"more hand-overs than kept", func() mark { return n.mark(name) }, func() {
			for i := range handedKept + 1 {
				msg(handover(fmt.Sprintf("other%d", i), "someone", "s", uint64(i+1)))
			}
		}, true, 0},
		{"resubscription", func() mark { return n.mark(name) }, func() {
			n.deliver(&redis.Subscription{Kind: "subscribe", Channel: name, Count: 1})
		}, true, 0},
		{"resubscription of the Client's own channel", func() mark { return n.mark(name) }, func() {
			n.deliver(&redis.Subscription{Kind: "subscribe", Channel: name + n.inbox, Count: 2})
		}, true, 0},
		{"not subscribed at the mark", func() mark { return n.mark("elsewhere") }, func() {}, true, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mk := c.mk()
			c.send()
			w, retry := n.watchSince(name, me, mk)
			defer n.unwatch(w)
			if retry != c.retry {
				t.Errorf("retry = %v, want %v", retry, c.retry)
			}
			f, ok := w.handover()
			if ok != (c.handed != 0) || f != c.handed {
				t.Errorf("handover() = %d, %v; want %d", f, ok, c.handed)
			}
			if c.handed != 0 {
				select {
				case <-w.sig:
				default:
					t.Error("hand-over passed on without a signal")
				}
			}
		})
	}
}

// TestParseHandover checks the parsing of hand-over messages: four words,
// the third a number; a message of four words whose third is not a number
// still names its call (it wakes that call, never grants it a hold).
func TestParseHandover(t *testing.T) {
	cases := []struct {
		p    string
		want handover
	}{
		{"id hd 7 pf", handover{id: "id", holder: "hd", proof: "pf", f: 7, ok: true}},
		{"id hd x pf", handover{id: "id"}},
		{"id hd -1 pf", handover{id: "id"}},
		{"id hd 7", handover{}},
		{"id hd 7 pf more", handover{}},
		{"id  7 pf", handover{id: "id", proof: "pf", f: 7, ok: true}},
		{"me 42", handover{}},
		{"", handover{}},
	}
	for _, c := range cases {
		if got := parseHandover(c.p); got != c.want {
			t.Errorf("parseHandover(%q) = %+v, want %+v", c.p, got, c.want)
		}
	}
}

// TestSums checks the digests hand-overs are checked with against the hex
// digests the scripts write.
func TestSums(t *testing.T) {
	tok := "3f1c5b7e-0000-4000-8000-000000000000@abc"
	if h := holderSum(tok); !h.is(digest(tok)) || h.is(digest(tok+"x")) || h.is("") {
		t.Errorf("holderSum(%q) does not match digest", tok)
	}
	if p := proofSum("secret", 12345); !p.is(digest("secret 12345")) || p.is(digest("secret 1234")) {
		t.Error("proofSum does not match digest of secret, space, fence")
	}
}

// TestSweepDoesNotHoldWaiters: the notifier's SUBSCRIBEs and UNSUBSCRIBEs
// wait on a pub/sub connection that is slow to come up (here a dial that
// hangs until its ctx ends), never under the lock that every waiter of the
// Client takes to watch and unwatch a channel: a sweep of idle channels
// then must not hold a waiter past its ctx.
func TestSweepDoesNotHoldWaiters(t *testing.T) {
	addr := redistest.Miniredis(t).Addrs[0]
	stop := make(chan struct{})
	rdb := redis.NewClient(&redis.Options{Addr: addr, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-stop:
			return nil, net.ErrClosed
		}
	}})
	n := newNotifier(rdb)
	t.Cleanup(func() {
		close(stop)
		n.close()
		rdb.Close()
	})

	// A channel watched (its SUBSCRIBE hangs in the dial), left idle long
	// enough ago for a sweep to unsubscribe it.
	n.unwatch(n.watch("idle"))
	n.mu.Lock()
	n.chans["idle"].idle = time.Now().Add(-2 * linger)
	n.mu.Unlock()

	// A sweep runs (and has returned, or is under way) while waiters watch
	// and unwatch channels.
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		n.sweep()
	}()
	select {
	case <-swept:
	case <-time.After(subscribeWait / 2):
	}
	took := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		for _, name := range []string{"busy", "other"} {
			n.unwatch(n.watch(name))
		}
		took <- time.Since(start)
	}()
	select {
	case d := <-took:
		if d > subscribeWait/2 {
			t.Errorf("watch and unwatch took %v while a sweep ran: the sweep held the notifier behind a connection slow to come up", d)
		}
	case <-time.After(5 * subscribeWait):
		// The clean-up ends the hanging dials, and with them the sweep.
		t.Fatalf("watch and unwatch did not return within %v while a sweep ran: the sweep holds the notifier behind a connection slow to come up", 5*subscribeWait)
	}
	<-swept
	n.mu.Lock()
	_, still := n.chans["idle"]
	n.mu.Unlock()
	if still {
		t.Error("the idle channel was not swept")
	}
}
