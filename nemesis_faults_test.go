package dsync_test

// The faults of the nemesis (nemesis_test.go), and the plain Redis access it
// needs to inject them: a per-"process" network emulator (stalled or failing
// commands, delayed pub/sub deliveries, a record of the scripts sent, for
// late duplicates), key deletion, forged and replayed notifications, and
// CLIENT PAUSE. Everything here goes through public interfaces: go-redis
// hooks and dialers, and plain commands on the keys and channels that carry
// the primitive's name as their hash tag.

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// errNemDown is the error of a command that the emulated network did not
// deliver (the server is unreachable).
var errNemDown = errors.New("nemesis: server unreachable (injected)")

// netem is the network of one emulated process: a go-redis hook and a
// dialer, installed on the process's own go-redis client.
type netem struct {
	stallUntil atomic.Int64 // unix ns: commands wait until then (or their ctx ends)
	pipesUntil atomic.Int64 // unix ns: pipelines (lease renewals) wait until then
	downUntil  atomic.Int64 // unix ns: commands fail at once until then
	psDelay    atomic.Int64 // ns: each read on a pub/sub connection is delivered this late

	rec *scriptLog // scripts sent, for late duplicates; nil: not recorded
}

var _ redis.Hook = (*netem)(nil)

// dial dials addr and wraps the connection, so that reads of pub/sub
// connections can be delayed.
func (n *netem) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &nemConn{Conn: c, n: n, closed: make(chan struct{})}, nil
}

// stall makes commands wait for d from now (a stalled network: requests
// reach the server late, or never if their ctx ends first).
func (n *netem) stall(d time.Duration) {
	raise(&n.stallUntil, time.Now().Add(d).UnixNano())
}

// stallPipes makes pipelines wait for d from now: the process's lease
// renewals, which it pipelines, are late (as when the renewer is starved),
// while its other commands go through.
func (n *netem) stallPipes(d time.Duration) {
	raise(&n.pipesUntil, time.Now().Add(d).UnixNano())
}

// down makes commands fail at once for d from now.
func (n *netem) down(d time.Duration) {
	raise(&n.downUntil, time.Now().Add(d).UnixNano())
}

func raise(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if old >= v || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// gate applies the current stall or outage to one command (or pipeline).
func (n *netem) gate(ctx context.Context, pipe bool) error {
	now := time.Now().UnixNano()
	if now < n.downUntil.Load() {
		return errNemDown
	}
	until := n.stallUntil.Load()
	if pipe {
		until = max(until, n.pipesUntil.Load())
	}
	if now < until {
		t := time.NewTimer(time.Duration(until - now))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		if time.Now().UnixNano() < n.downUntil.Load() {
			return errNemDown
		}
	}
	return nil
}

// DialHook passes dials through: dials are wrapped by the dialer.
func (n *netem) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook stalls or fails commands, and records scripts.
func (n *netem) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if nemSetup(cmd) {
			return next(ctx, cmd)
		}
		if err := n.gate(ctx, false); err != nil {
			cmd.SetErr(err)
			return err
		}
		n.rec.add(ctx, cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook stalls or fails pipelines, and records their scripts.
func (n *netem) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		setup := true
		for _, c := range cmds {
			setup = setup && nemSetup(c)
		}
		if setup {
			// go-redis's handshake on a new connection.
			return next(ctx, cmds)
		}
		if err := n.gate(ctx, true); err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		for _, c := range cmds {
			n.rec.add(ctx, c)
		}
		return next(ctx, cmds)
	}
}

// nemSetup reports whether cmd is one go-redis sends when it sets up a
// connection.
func nemSetup(cmd redis.Cmder) bool {
	switch strings.ToLower(cmd.Name()) {
	case "hello", "auth", "client", "select", "readonly":
		return true
	}
	return false
}

// nemConn delays what a pub/sub connection reads by the process's psDelay.
// A connection is a pub/sub one once it has sent a SUBSCRIBE.
type nemConn struct {
	net.Conn
	n      *netem
	pubsub atomic.Bool
	once   sync.Once
	closed chan struct{}
}

func (c *nemConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

var subscribeCmd = []byte("subscribe\r\n")

func (c *nemConn) Write(p []byte) (int, error) {
	if !c.pubsub.Load() && bytes.Contains(bytes.ToLower(p), subscribeCmd) {
		c.pubsub.Store(true)
	}
	return c.Conn.Write(p)
}

func (c *nemConn) Read(p []byte) (int, error) {
	k, err := c.Conn.Read(p)
	if k > 0 && c.pubsub.Load() {
		if d := time.Duration(c.n.psDelay.Load()); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-c.closed:
				t.Stop()
			}
		}
	}
	return k, err
}

// scriptLog remembers the last scripts (EVALSHA, EVAL) a process sent, with
// the time they were sent, so that a copy can be delivered again later on
// another connection: the first copy of a command that go-redis re-sent
// after a read timeout.
type scriptLog struct {
	mu   sync.Mutex
	ring []sentScript
	next int
	n    int
}

type sentScript struct {
	at   time.Time
	op   string // what the test was doing (see nemOp); "" for the Client's own work
	args []any
}

// nemOpKey tags the ctx of a call with what the test does ("acquire",
// "release"), so that the scripts a call sends can be told apart: dsync
// passes the caller's ctx (or one derived from it) down to go-redis.
type nemOpKey struct{}

func nemOp(ctx context.Context) string {
	op, _ := ctx.Value(nemOpKey{}).(string)
	return op
}

func newScriptLog(size int) *scriptLog { return &scriptLog{ring: make([]sentScript, size)} }

func (l *scriptLog) add(ctx context.Context, cmd redis.Cmder) {
	if l == nil {
		return
	}
	switch strings.ToLower(cmd.Name()) {
	case "evalsha", "eval", "evalsha_ro", "eval_ro":
	default:
		return
	}
	args := append([]any(nil), cmd.Args()...)
	l.mu.Lock()
	l.ring[l.next] = sentScript{at: time.Now(), op: nemOp(ctx), args: args}
	l.next = (l.next + 1) % len(l.ring)
	l.n = min(l.n+1, len(l.ring))
	l.mu.Unlock()
}

// pick returns up to k scripts sent between minAge and maxAge ago by calls
// of kind op ("" for any), and accepted by ok if not nil, at random.
func (l *scriptLog) pick(r *rand.Rand, k int, minAge, maxAge time.Duration, op string, ok func(args []any) bool) [][]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	var idx []int
	for i := 0; i < l.n; i++ {
		age := now.Sub(l.ring[i].at)
		if age >= minAge && age <= maxAge && (op == "" || l.ring[i].op == op) && (ok == nil || ok(l.ring[i].args)) {
			idx = append(idx, i)
		}
	}
	var out [][]any
	for j := 0; j < k && len(idx) > 0; j++ {
		p := r.IntN(len(idx))
		out = append(out, l.ring[idx[p]].args)
		idx[p] = idx[len(idx)-1]
		idx = idx[:len(idx)-1]
	}
	return out
}

// nemMasters calls f on every master of rdb (the client itself for a
// single server).
func nemMasters(ctx context.Context, rdb redis.UniversalClient, f func(ctx context.Context, c *redis.Client) error) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, f)
	case *redis.Client:
		return f(ctx, c)
	}
	return errors.New("nemesis: unsupported client")
}

// nemScan returns the keys matching pattern on every master, at most max.
func nemScan(ctx context.Context, rdb redis.UniversalClient, pattern string, max int) ([]string, error) {
	var mu sync.Mutex
	var keys []string
	err := nemMasters(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		var cursor uint64
		for range 1000 {
			ks, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			keys = append(keys, ks...)
			full := len(keys) >= max
			mu.Unlock()
			if next == 0 || full {
				return nil
			}
			cursor = next
		}
		return nil
	})
	return keys, err
}

// nemChannels returns the channels matching pattern that have subscribers.
func nemChannels(ctx context.Context, rdb redis.UniversalClient, pattern string) ([]string, error) {
	seen := map[string]bool{}
	var mu sync.Mutex
	err := nemMasters(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		chs, err := c.PubSubChannels(ctx, pattern).Result()
		mu.Lock()
		for _, ch := range chs {
			seen[ch] = true
		}
		mu.Unlock()
		return err
	})
	out := make([]string, 0, len(seen))
	for ch := range seen {
		out = append(out, ch)
	}
	return out, err
}

// nemPattern is the SCAN/PSUBSCRIBE pattern of every key and channel of the
// primitive called name (or, with a trailing '*' in name, of every name
// with that prefix): they all carry the name as their hash tag.
func nemPattern(name string) string { return "dsync:{" + name + "*" }

// nemWords returns what a key holds, as the strings a waiter could be
// addressed by: for each hash field, the field and the words of its value;
// the members of a zset or set; the words of a string or list. Each entry
// is one group of strings found together (a field and its value).
func nemWords(ctx context.Context, rdb redis.UniversalClient, key string) [][]string {
	typ, err := rdb.Type(ctx, key).Result()
	if err != nil {
		return nil
	}
	var out [][]string
	switch typ {
	case "hash":
		m, _ := rdb.HGetAll(ctx, key).Result()
		for f, v := range m {
			out = append(out, append([]string{f}, strings.Fields(v)...))
		}
	case "zset":
		ms, _ := rdb.ZRange(ctx, key, 0, 200).Result()
		for _, m := range ms {
			out = append(out, []string{m})
		}
	case "set":
		ms, _ := rdb.SMembers(ctx, key).Result()
		for _, m := range ms {
			out = append(out, []string{m})
		}
	case "string":
		v, _ := rdb.Get(ctx, key).Result()
		out = append(out, strings.Fields(v))
	case "list":
		vs, _ := rdb.LRange(ctx, key, 0, 200).Result()
		for _, v := range vs {
			out = append(out, strings.Fields(v))
		}
	}
	return out
}

// idLike reports whether s could be a token or a call id: not a number, not
// a key, not tiny.
func idLike(s string) bool {
	if len(s) < 6 || strings.HasPrefix(s, "dsync:") || strings.HasPrefix(s, ":") {
		return false
	}
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		return false
	}
	return true
}

// forgeries returns the hand-over payloads a publisher that can read the
// keys of a name could forge: "<id> <fence>" and "<id> <id> <fence>" for
// the ids found together in one field, with absurd and plausible fences.
func forgeries(r *rand.Rand, groups [][]string, plausible uint64) []string {
	fences := []string{"424242", "9223372036854775808", "18446744073709551615", "1",
		strconv.FormatUint(plausible, 10), strconv.FormatUint(plausible+1000, 10)}
	var out []string
	for _, g := range groups {
		var ids []string
		for _, s := range g {
			if idLike(s) {
				ids = append(ids, s)
			}
		}
		for i, a := range ids {
			f := fences[r.IntN(len(fences))]
			out = append(out, a+" "+f)
			for j, b := range ids {
				if i != j {
					out = append(out, a+" "+b+" "+fences[r.IntN(len(fences))])
				}
			}
		}
	}
	return out
}

// heard is one notification seen on a dsync channel.
type heard struct {
	at      time.Time
	channel string
	payload string
}

// listener records the notifications published on the channels of a set
// of names, so that they can be delivered again later.
type listener struct {
	ps   *redis.PubSub
	done chan struct{}

	mu   sync.Mutex
	ring []heard
	next int
	n    int
}

func listen(ctx context.Context, rdb redis.UniversalClient, pattern string) (*listener, error) {
	ps := rdb.PSubscribe(ctx, pattern)
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return nil, err
	}
	l := &listener{ps: ps, done: make(chan struct{}), ring: make([]heard, 512)}
	go func() {
		defer close(l.done)
		for {
			m, err := ps.ReceiveTimeout(context.Background(), time.Second)
			if errors.Is(err, redis.ErrClosed) {
				return
			}
			msg, ok := m.(*redis.Message)
			if err != nil || !ok {
				if err != nil {
					time.Sleep(10 * time.Millisecond) // go-redis reconnects on the next call
				}
				continue
			}
			l.mu.Lock()
			l.ring[l.next] = heard{at: time.Now(), channel: msg.Channel, payload: msg.Payload}
			l.next = (l.next + 1) % len(l.ring)
			l.n = min(l.n+1, len(l.ring))
			l.mu.Unlock()
		}
	}()
	return l, nil
}

func (l *listener) close() {
	_ = l.ps.Close()
	<-l.done
}

// pick returns up to k notifications heard between minAge and maxAge ago,
// preferring hand-overs (non-empty payloads).
func (l *listener) pick(r *rand.Rand, k int, minAge, maxAge time.Duration) []heard {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	var cands []heard
	for i := 0; i < l.n; i++ {
		h := l.ring[i]
		if age := now.Sub(h.at); age >= minAge && age <= maxAge && (h.payload != "" || r.IntN(4) == 0) {
			cands = append(cands, h)
		}
	}
	r.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	return cands[:min(k, len(cands))]
}

// nemPause pauses every client's writes (scripts included) on every master
// for d: the server is unreachable for writes, then answers everything.
func nemPause(ctx context.Context, rdb redis.UniversalClient, d time.Duration) error {
	return nemMasters(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		return c.Do(ctx, "client", "pause", strconv.FormatInt(d.Milliseconds(), 10), "write").Err()
	})
}
