package dsync_test

// The faults of the nemesis (nemesis_test.go), and the plain Redis access it
// needs to inject them: a per-"process" network emulator (stalled or failing
// commands, delayed pub/sub deliveries, a stalled lease renewer, a record of
// the scripts sent, for late duplicates), key deletion, forged and replayed
// notifications, and CLIENT PAUSE. Everything here goes through public
// interfaces (go-redis hooks and dialers, plain commands on the keys and
// channels that carry the primitive's name as their hash tag) and one test
// hook, dsync.SetRenewStall.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
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
	renewUntil atomic.Int64 // unix ns: the Client's renewer does not send until then
	downUntil  atomic.Int64 // unix ns: commands fail at once until then
	psDelay    atomic.Int64 // ns: what a pub/sub connection reads is delivered this long after it arrived

	rec   *scriptLog // scripts sent, for late duplicates; nil: not recorded
	idx   int        // the process; -1: the test's own client
	trace *nemTrace  // commands and replies, for the reports; nil: none
	ids   *sync.Map  // the words (call ids, tokens) its scripts carried; nil: not kept
	// passed is called for each release that passed the lock to a call
	// waiting in the process (cohort.go); nil: not counted.
	passed func()
}

// countPass calls n.passed if cmd, answered, is a release that passed the
// lock: a Mutex unlock with the pass arguments, replied {4, token}.
func (n *netem) countPass(cmd redis.Cmder) {
	c, ok := cmd.(*redis.Cmd)
	if n.passed == nil || !ok || !passCmd(cmd) {
		return
	}
	if r, ok := c.Val().([]any); ok && len(r) == 2 && r[0] == int64(4) {
		n.passed()
	}
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

// stallRenewals makes the process's lease renewer send nothing for d from
// now (as when it is starved), while its other commands go through. It
// takes effect through renewStall, installed with dsync.SetRenewStall.
func (n *netem) stallRenewals(d time.Duration) {
	raise(&n.renewUntil, time.Now().Add(d).UnixNano())
}

// renewStall returns the hook for dsync.SetRenewStall: called before each
// batch of renewals, it blocks until the renewal stall is over or done is
// closed. The renewer's scheduler, which declares leases lost at their
// deadlines, keeps running meanwhile.
func (n *netem) renewStall(done <-chan struct{}) func() {
	return func() {
		for range 1000 {
			d := time.Until(time.Unix(0, n.renewUntil.Load()))
			if d <= 0 {
				return
			}
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-done:
				t.Stop()
				return
			}
		}
	}
}

// down makes commands fail at once for d from now.
func (n *netem) down(d time.Duration) {
	raise(&n.downUntil, time.Now().Add(d).UnixNano())
}

func raise(a *atomic.Int64, v int64) {
	for range 1000 {
		old := a.Load()
		if old >= v || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// gate applies the current stall or outage to one command (or pipeline).
func (n *netem) gate(ctx context.Context) error {
	now := time.Now().UnixNano()
	if now < n.downUntil.Load() {
		return errNemDown
	}
	if until := n.stallUntil.Load(); now < until {
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
		called := time.Now()
		if err := n.gate(ctx); err != nil {
			cmd.SetErr(err)
			n.trace.add(n.idx, called, time.Time{}, cmd)
			return err
		}
		n.rec.add(ctx, cmd)
		n.keepIDs(cmd)
		sent := time.Now()
		err := next(ctx, cmd)
		n.trace.add(n.idx, called, sent, cmd)
		n.countPass(cmd)
		return err
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
		called := time.Now()
		if err := n.gate(ctx); err != nil {
			for _, c := range cmds {
				c.SetErr(err)
				n.trace.add(n.idx, called, time.Time{}, c)
			}
			return err
		}
		for _, c := range cmds {
			n.rec.add(ctx, c)
			n.keepIDs(c)
		}
		sent := time.Now()
		err := next(ctx, cmds)
		for _, c := range cmds {
			n.trace.add(n.idx, called, sent, c)
			n.countPass(c)
		}
		return err
	}
}

// keepIDs notes the words a script carries (its call id among them), if
// ids are kept.
func (n *netem) keepIDs(cmd redis.Cmder) {
	if n.ids == nil || !isScript(cmd) {
		return
	}
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && idLike(s) {
			n.ids.Store(s, true)
		}
	}
}

// sent reports whether the process sent a script carrying id.
func (n *netem) sent(id string) bool {
	if n.ids == nil {
		return false
	}
	_, ok := n.ids.Load(id)
	return ok
}

func isScript(cmd redis.Cmder) bool {
	switch strings.ToLower(cmd.Name()) {
	case "evalsha", "eval", "evalsha_ro", "eval_ro":
		return true
	}
	return false
}

// isSecret reports whether s has the form of a waiting call's secret (16
// random bytes in hex, possibly followed by '@' and its Client's inbox id,
// 16 bytes in hex too), which hand-overs prove they know.
func isSecret(s string) bool {
	if s, inbox, ok := strings.Cut(s, "@"); ok {
		return isHex32(s) && isHex32(inbox)
	}
	return isHex32(s)
}

func isHex32(s string) bool {
	if len(s) != 32 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// nemTrace is a bounded record of what the processes sent and what they
// got back, and of the notifications published, so that a failing check
// can show what happened to its name.
type nemTrace struct {
	mu   sync.Mutex
	ring []traceEntry
	next int
	n    int
}

type traceEntry struct {
	at   time.Time   // the command was called (or the notification heard)
	sent time.Time   // it passed the emulated network; zero: it did not
	done time.Time   // it returned
	proc int         // -1: the test's own client
	cmd  redis.Cmder // nil for a notification
	note string      // a notification: "<channel> <payload>"
}

func newTrace(size int) *nemTrace { return &nemTrace{ring: make([]traceEntry, size)} }

func (tr *nemTrace) add(proc int, at, sent time.Time, cmd redis.Cmder) {
	if tr == nil {
		return
	}
	tr.put(traceEntry{at: at, sent: sent, done: time.Now(), proc: proc, cmd: cmd})
}

func (tr *nemTrace) heard(h heard) {
	if tr == nil {
		return
	}
	tr.put(traceEntry{at: h.at, proc: -1, note: h.channel + " " + strconv.Quote(h.payload)})
}

func (tr *nemTrace) put(e traceEntry) {
	tr.mu.Lock()
	tr.ring[tr.next] = e
	tr.next = (tr.next + 1) % len(tr.ring)
	tr.n = min(tr.n+1, len(tr.ring))
	tr.mu.Unlock()
}

// about returns, in time order, the entries from..to accepted by keep that
// concern the keys or channels carrying tag, each formatted by line: at
// most the first and the last max/2.
func (tr *nemTrace) about(tag string, from, to time.Time, max int, keep func(traceEntry) bool, line func(e traceEntry, text string) string) []string {
	tr.mu.Lock()
	var es []traceEntry
	for i := 0; i < tr.n; i++ {
		e := tr.ring[i]
		if e.at.Before(from) || e.at.After(to) || !keep(e) {
			continue
		}
		if e.cmd == nil {
			if strings.Contains(e.note, tag) {
				es = append(es, e)
			}
			continue
		}
		for _, a := range e.cmd.Args() {
			if s, ok := a.(string); ok && strings.Contains(s, tag) {
				es = append(es, e)
				break
			}
		}
	}
	tr.mu.Unlock()
	sort.Slice(es, func(i, j int) bool { return es[i].at.Before(es[j].at) })
	out := make([]string, 0, min(len(es), max+1))
	for i, e := range es {
		if len(es) > max && i >= max/2 && i < len(es)-max/2 {
			if i == max/2 {
				out = append(out, fmt.Sprintf("  ... %d entries left out ...", len(es)-max/2*2))
			}
			continue
		}
		text := e.note
		if e.cmd != nil {
			text = traceCmd(e.cmd)
		}
		out = append(out, line(e, text))
	}
	return out
}

// traceCmd formats a command and its outcome, the script's sha shortened.
func traceCmd(cmd redis.Cmder) string {
	args := cmd.Args()
	parts := make([]string, 0, len(args)+2)
	for i, a := range args {
		s := fmt.Sprint(a)
		if i == 1 && isScript(cmd) && len(s) == 40 {
			s = s[:8]
		}
		parts = append(parts, s)
	}
	out := strings.Join(parts, " ")
	if err := cmd.Err(); err != nil {
		return out + " -> error: " + err.Error()
	}
	if c, ok := cmd.(*redis.Cmd); ok {
		return out + fmt.Sprintf(" -> %v", c.Val())
	}
	return out
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

// nemConn delays what a pub/sub connection reads by the process's psDelay:
// each chunk the server sends is delivered psDelay after it arrived (a slow
// network, not a slow reader: delays do not add up). A connection is a
// pub/sub one once it has sent a SUBSCRIBE. Its reads then go through a
// goroutine that stamps each chunk with its arrival; read deadlines are
// kept by Read itself, so that the goroutine can block on the connection.
type nemConn struct {
	net.Conn
	n      *netem
	pubsub atomic.Bool
	once   sync.Once
	closed chan struct{}

	readDL atomic.Int64 // unix ns of the read deadline while delayed; 0: none
	start  sync.Once    // of readLoop
	chunks chan nemChunk
	cur    *nemChunk // being delivered; only Read touches it
}

type nemChunk struct {
	at  time.Time // arrival
	b   []byte
	err error
}

func (c *nemConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// delayed reports whether reads are delayed.
func (c *nemConn) delayed() bool { return c.pubsub.Load() && c.n.psDelay.Load() > 0 }

var subscribeCmd = []byte("subscribe\r\n")

func (c *nemConn) Write(p []byte) (int, error) {
	if !c.pubsub.Load() && bytes.Contains(bytes.ToLower(p), subscribeCmd) {
		c.pubsub.Store(true)
		if c.delayed() {
			// From now on Read keeps the read deadline.
			c.readDL.Store(0)
			_ = c.Conn.SetReadDeadline(time.Time{})
		}
	}
	return c.Conn.Write(p)
}

func (c *nemConn) SetReadDeadline(t time.Time) error {
	if !c.delayed() {
		return c.Conn.SetReadDeadline(t)
	}
	if t.IsZero() {
		c.readDL.Store(0)
	} else {
		c.readDL.Store(t.UnixNano())
	}
	return nil
}

func (c *nemConn) SetDeadline(t time.Time) error {
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.SetReadDeadline(t)
}

func (c *nemConn) Read(p []byte) (int, error) {
	if !c.delayed() {
		return c.Conn.Read(p)
	}
	c.start.Do(func() {
		c.chunks = make(chan nemChunk, 64)
		go c.readLoop()
	})
	var deadline <-chan time.Time
	if dl := c.readDL.Load(); dl != 0 {
		t := time.NewTimer(time.Until(time.Unix(0, dl)))
		defer t.Stop()
		deadline = t.C
	}
	if c.cur == nil {
		select {
		case ch := <-c.chunks:
			c.cur = &ch
		case <-deadline:
			return 0, os.ErrDeadlineExceeded
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
	if wait := time.Until(c.cur.at.Add(time.Duration(c.n.psDelay.Load()))); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-deadline:
			return 0, os.ErrDeadlineExceeded
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
	if len(c.cur.b) == 0 {
		if c.cur.err != nil {
			return 0, c.cur.err
		}
		c.cur = nil
		return 0, nil
	}
	k := copy(p, c.cur.b)
	c.cur.b = c.cur.b[k:]
	if len(c.cur.b) == 0 && c.cur.err == nil {
		c.cur = nil
	}
	return k, nil
}

// readLoop reads the connection into c.chunks until it fails or closes.
func (c *nemConn) readLoop() {
	for range 100_000_000 { // bounded; the connection's end ends it first
		buf := make([]byte, 4096)
		k, err := c.Conn.Read(buf)
		select {
		case c.chunks <- nemChunk{at: time.Now(), b: buf[:k], err: err}:
		case <-c.closed:
			return
		}
		if err != nil {
			return
		}
	}
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
// "try" for a TryLock, TryRLock or TryAcquire, "release"), so that the
// scripts a call sends can be told apart: dsync passes the caller's ctx (or
// one derived from it) down to go-redis.
type nemOpKey struct{}

// nemTookKey's value in an acquire's ctx is a *uint64 that a Semaphore
// Acquire that succeeds sets to the fencing token of the holding its
// permits went into (dsync.SetSemaphoreTook): the holder's Lease, read
// after the call, may be of a holding that another call of the holder
// took since.
type nemTookKey struct{}

func nemTook(ctx context.Context, fence uint64) {
	if p, ok := ctx.Value(nemTookKey{}).(*uint64); ok {
		*p = fence
	}
}

func nemOp(ctx context.Context) string {
	op, _ := ctx.Value(nemOpKey{}).(string)
	return op
}

func newScriptLog(size int) *scriptLog { return &scriptLog{ring: make([]sentScript, size)} }

func (l *scriptLog) add(ctx context.Context, cmd redis.Cmder) {
	if l == nil || !isScript(cmd) {
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
// of a kind op accepts, and accepted by ok if not nil, at random.
func (l *scriptLog) pick(r *rand.Rand, k int, minAge, maxAge time.Duration, op func(string) bool, ok func(args []any) bool) []sentScript {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	var idx []int
	for i := 0; i < l.n; i++ {
		age := now.Sub(l.ring[i].at)
		if age >= minAge && age <= maxAge && op(l.ring[i].op) && (ok == nil || ok(l.ring[i].args)) {
			idx = append(idx, i)
		}
	}
	var out []sentScript
	for j := 0; j < k && len(idx) > 0; j++ {
		p := r.IntN(len(idx))
		out = append(out, l.ring[idx[p]])
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
// a key, not tiny, not a secret.
func idLike(s string) bool {
	if len(s) < 6 || strings.HasPrefix(s, "dsync:") || strings.HasPrefix(s, ":") || isSecret(s) {
		return false
	}
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		return false
	}
	return true
}

// A forgery is one forged notification.
type forgery struct {
	payload string
	kind    string // what it tries, for the counts
	queued  bool   // it names a call read from a queue (a waiting call)
}

// Hand-over fences that no script issues: fencing tokens track the
// server's clock in µs (about 1.8e15) and stay below 2^53.
var absurdFences = []string{"1", "424242", "9007199254740991"}

// forgeries returns the hand-overs that a publisher who reads the keys of a
// name can forge, in the format of lua/lib.lua, "<call id> <sha1(holder)>
// <fence> <proof>", with proof sha1(secret .. ' ' .. fence) over the
// waiting call's secret. groups are what the keys hold (see nemWords), one
// group per queued call: its id, holder token and secret among other
// words; fences are plausible fencing tokens. It forges hand-overs without
// a proof (the older formats, a missing or junk proof) and with a
// plausible one: a digest of what the forger knows (the call id, the
// holder, its digest, another call's secret, nothing), of a secret one
// character off, of the right secret for another fence, or of the right
// secret for a fence no script sends (0, past 2^53). None of them is valid:
// a waiter may wake on them and must never take them for a grant. What it
// never forges is the one hand-over a script would send (the right secret
// and an issuable fence): that would be a grant by design, from someone
// the design trusts with the keys' contents.
// (sha1hex, in rwmutex_test.go, is the scripts' redis.sha1hex.)
func forgeries(r *rand.Rand, groups [][]string, fences []string) []forgery {
	var secrets []string
	for _, g := range groups {
		for _, w := range g {
			if isSecret(w) {
				secrets = append(secrets, w)
			}
		}
	}
	own := callSecrets(groups)
	pick := func(ss []string) string { return ss[r.IntN(len(ss))] }
	fences = append(slices.Clone(fences), absurdFences...)
	var out []forgery
	for _, g := range groups {
		var ids []string
		secret := ""
		for _, w := range g {
			switch {
			case isSecret(w) && secret == "":
				secret = w
			case idLike(w):
				ids = append(ids, w)
			}
		}
		queued := secret != ""
		for i, cid := range ids {
			holder := cid
			if len(ids) > 1 {
				holder = ids[(i+1+r.IntN(len(ids)-1))%len(ids)]
			}
			hd := sha1hex(holder)
			f := pick(fences)
			add := func(kind, p string) { out = append(out, forgery{payload: p, kind: kind, queued: queued}) }
			// Without a proof.
			add("no proof", cid+" "+f)
			add("no proof", cid+" "+holder+" "+f)
			add("no proof", cid+" "+hd+" "+f)
			add("junk proof", cid+" "+hd+" "+f+" "+sha1hex(strconv.FormatUint(r.Uint64(), 16)))
			add("junk proof", cid+" "+hd+" "+f+" "+hd)
			// With a plausible proof.
			for _, x := range []string{cid, holder, hd, ""} {
				add("plausible proof", cid+" "+hd+" "+f+" "+sha1hex(x+" "+f))
			}
			if len(secrets) > 0 {
				// Another call's secret (not one found with this id).
				if o := pick(secrets); !slices.Contains(own[cid], o) {
					add("plausible proof", cid+" "+hd+" "+f+" "+sha1hex(o+" "+f))
				}
			}
			if secret != "" {
				b := []byte(secret)
				k := r.IntN(len(b))
				b[k] = "0123456789abcdef"[(strings.IndexByte("0123456789abcdef", b[k])+1+r.IntN(15))%16]
				add("plausible proof", cid+" "+hd+" "+f+" "+sha1hex(string(b)+" "+f))
				if f2 := pick(fences); f2 != f {
					add("plausible proof", cid+" "+hd+" "+f+" "+sha1hex(secret+" "+f2))
				}
				add("plausible proof", cid+" "+hd+" "+f+" "+sha1hex(secret+f))
				if s, _, ok := strings.Cut(secret, "@"); ok {
					// The secret without the Client's inbox id.
					add("plausible proof", cid+" "+hd+" "+f+" "+sha1hex(s+" "+f))
				}
				for _, bad := range []string{"0", "9007199254740993", "18446744073709551615"} {
					add("proof of a fence no script sends", cid+" "+hd+" "+bad+" "+sha1hex(secret+" "+bad))
				}
			}
		}
	}
	return out
}

// callSecrets maps each id found in groups to the secrets found with it:
// the secrets a call with that id may have given the scripts.
func callSecrets(groups [][]string) map[string][]string {
	m := map[string][]string{}
	for _, g := range groups {
		for _, s := range g {
			if !isSecret(s) {
				continue
			}
			for _, id := range g {
				if idLike(id) {
					m[id] = append(m[id], s)
				}
			}
		}
	}
	return m
}

// grants reports whether a waiting call would take payload for a hand-over
// to it: it has the form of one, an issuable fence and the proof over a
// secret of the call it names (secretsOf, see callSecrets). The nemesis
// never publishes such a payload.
func grants(payload string, secretsOf map[string][]string) bool {
	parts := strings.Split(payload, " ")
	if len(parts) != 4 {
		return false
	}
	f, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil || f == 0 || f > 1<<53 {
		return false
	}
	for _, s := range secretsOf[parts[0]] {
		if parts[3] == sha1hex(s+" "+strconv.FormatUint(f, 10)) {
			return true
		}
	}
	return false
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
	ps    *redis.PubSub
	done  chan struct{}
	onMsg func(heard) // called for each notification, on the listener's goroutine

	mu   sync.Mutex
	ring []heard
	next int
	n    int
}

func listen(ctx context.Context, rdb redis.UniversalClient, pattern string, onMsg func(heard)) (*listener, error) {
	ps := rdb.PSubscribe(ctx, pattern)
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return nil, err
	}
	l := &listener{ps: ps, done: make(chan struct{}), ring: make([]heard, 512), onMsg: onMsg}
	go func() {
		defer close(l.done)
		// Bounded, though close ends it first: a run hears far fewer.
		for range 10_000_000 {
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
			h := heard{at: time.Now(), channel: msg.Channel, payload: msg.Payload}
			l.mu.Lock()
			l.ring[l.next] = h
			l.next = (l.next + 1) % len(l.ring)
			l.n = min(l.n+1, len(l.ring))
			l.mu.Unlock()
			if l.onMsg != nil {
				l.onMsg(h)
			}
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

// TestNemesisForgeriesNeverGrant checks the forger of the nemesis itself:
// every hand-over it forges from the queue data of each primitive fails the
// waiter's check (grants), while the hand-over a script would publish for
// the same data passes it, so the check is not vacuous.
func TestNemesisForgeriesNeverGrant(t *testing.T) {
	const (
		tok    = "0b7d7a0e-7a53-4f0e-9a3b-6f1d2c3b4a59"
		cid    = "2e7o97qqo1655"
		secret = "c7d5c9f741f7f4d61d21cb0f3b45dea8"
		other  = "0bc9fc1529617e24753519c70f39b6dc"
		fence  = "1795422193779448"
		// A call without an owner: its secret names its Client's inbox.
		tok2    = "5f0c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f"
		cid2    = "3f8p08rrp2766"
		secret2 = "a1b2c3d4e5f60718293a4b5c6d7e8f90@9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b"
	)
	groups := [][]string{
		{tok, "1795422195000", "1626", cid, secret},      // Mutex: token -> "<deadline> <ttl> <cid> <secret>"
		{cid, "1795422195000", "1626", "2", secret, tok}, // Semaphore: cid -> "<deadline> <ttl> <n> <secret> <token>"
		{tok + "@x1", "1626", "php5wkirn3k4", other},     // RWMutex writer: token -> "<ttl> <cid> <secret>"
		{tok, "1"}, // a holder's count
		{tok2, "1795422195000", "1626", cid2, secret2},
	}
	secretsOf := callSecrets(groups)
	real := cid + " " + sha1hex(tok) + " " + fence + " " + sha1hex(secret+" "+fence)
	if !grants(real, secretsOf) {
		t.Fatalf("grants(%q) = false for the hand-over a script would publish", real)
	}
	real2 := cid2 + " " + sha1hex(tok2) + " " + fence + " " + sha1hex(secret2+" "+fence)
	if !grants(real2, secretsOf) {
		t.Fatalf("grants(%q) = false for the hand-over a script would publish", real2)
	}
	kinds := map[string]int{}
	r := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		for _, f := range forgeries(r, groups, []string{fence, "1795422193779449"}) {
			kinds[f.kind]++
			if grants(f.payload, secretsOf) {
				t.Errorf("forged %s hand-over %q would be granted", f.kind, f.payload)
			}
		}
	}
	for _, k := range []string{"no proof", "junk proof", "plausible proof", "proof of a fence no script sends"} {
		if kinds[k] == 0 {
			t.Errorf("no forgery of kind %q (got %v)", k, kinds)
		}
	}
}
