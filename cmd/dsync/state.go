package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync/internal/keys"
)

// Reading: what is in Redis for a name, read without changing anything. The
// names of the keys come from internal/keys, whose docs say what each key
// holds (after the headers of lua/*.lua); this file turns their fields into
// a lockState. One name may carry several primitives at once (a Mutex and a
// Once called "x" are independent); inspect reads each one it finds. What it
// reads of each:
//
//	Mutex      lock hash: <holder> -> reentry count, ':f' fencing token of
//	           the hold, ':w' someone waited (a refused attempt, or a hold
//	           taken from the queue); PTTL = lease. Queue zset: waiter ->
//	           arrival; queue data: "<place deadline ms> <ttl ms> <call id>
//	           <secret>". Fence hash 'n'.
//	RWMutex    writer hash as the lock hash above. Readers zset: reader ->
//	           lease deadline; readers hash: reader -> "<reentry count> <hold
//	           id> <call ids>". Waiting writers zset: writer -> place deadline, and
//	           arrival in the writers' queue once queued. Waiting readers
//	           hash: reader -> "<place deadline ms> <ttl ms> <call id>".
//	           Fence hash 'n'.
//	Semaphore  state hash ':size', ':used', <holder> -> permits, ':f:'<holder>
//	           -> fencing token. Holders zset: holder -> lease deadline.
//	           Queue zset: call id -> arrival; queue data: "<place deadline
//	           ms> <ttl ms> <n> <secret> <holder>". Fence hash 'n' (the
//	           Mutex's).
//	Once       run hash 't' token of the running call (a call token, not an
//	           owner token); PTTL = run lease. Done hash 'v' the value; PTTL =
//	           period left (none: kept until reset).
//
// A holder is an owner token, under client reentrancy followed by "@<client
// id>" (Mutex, RWMutex), or a handle's token. The ids of calls (':c', the
// readers hash after the count and hold id, the call ids zsets of Mutex,
// RWMutex, Semaphore and Once) serve the scripts' answer to repeated and
// abandoned calls, and the secrets of queued calls
// prove a hand-over to them; neither is shown.

const (
	maxShown     = 100    // holders and waiters read per primitive
	scanCount    = 1000   // COUNT hint of each SCAN call
	maxScanCalls = 10_000 // SCAN calls per node before list gives up
)

// lockState is what inspect and list report about one primitive.
type lockState struct {
	Name string `json:"name"`
	Key  string `json:"key"` // the primitive's main key
	// Mode is the primitive: "mutex", "rwmutex", "semaphore" or "once";
	// "" when only bookkeeping (a fencing counter, recent call ids) is
	// left, or no key exists at all.
	Mode string `json:"mode"`
	// State is "held" (mutex, rwmutex, semaphore), "running", "done" or
	// "idle" (once), "free" (nothing held; bookkeeping may be left) or
	// "absent" (no key of the name exists).
	State   string   `json:"state"`
	Holders []holder `json:"holders"`
	// TTLMillis is the lease left of the current hold (a Mutex, the writer
	// of an RWMutex, the run of a Once), -1 when none.
	TTLMillis int64 `json:"ttl_ms"`
	// Fence is the fencing token of the current hold; LastFence the last
	// token given out under the name (it survives the hold).
	Fence     uint64 `json:"fence,omitempty"`
	LastFence uint64 `json:"last_fence,omitempty"`
	// Contended reports that the release of the current Mutex hold will
	// wake waiters: an attempt was refused during the hold, or the hold was
	// taken from the queue, where others may wait behind it.
	Contended bool `json:"contended,omitempty"`
	// Size and Used: a Semaphore's size and permits held in all.
	Size int64 `json:"size,omitempty"`
	Used int64 `json:"used,omitempty"`
	// Done, ValueBytes and DoneTTLMillis: a Once's done mark, the size of
	// its value and how long the mark lasts (-1: until reset).
	Done          bool  `json:"done,omitempty"`
	ValueBytes    int   `json:"value_bytes,omitempty"`
	DoneTTLMillis int64 `json:"done_ttl_ms,omitempty"`
	// Waiters lists the first waiters; WaitersTotal counts all of them.
	// Mutex waiters appear from their first refused attempt (they queue
	// then), RWMutex writers once they waited past 1 ms; Once waiters are
	// not recorded.
	Waiters      []waiter `json:"waiters"`
	WaitersTotal int64    `json:"waiters_total"`
}

type holder struct {
	// Owner is the holder's token: an owner token ("<token>@<client id>"
	// under client reentrancy) or a handle's token; for a Once, the token
	// of the running call.
	Owner string `json:"owner"`
	// Count is the owner's reentry count, or a Semaphore holder's permits.
	Count int64 `json:"count"`
	// Kind is "read" or "write" for an RWMutex.
	Kind string `json:"kind,omitempty"`
	// TTLMillis is the holder's own lease left, where each holder has one
	// (RWMutex readers, Semaphore holders).
	TTLMillis int64  `json:"ttl_ms,omitempty"`
	Fence     uint64 `json:"fence,omitempty"`
}

type waiter struct {
	Owner string `json:"owner"`
	Kind  string `json:"kind,omitempty"` // "read" or "write" for an RWMutex
	N     int64  `json:"n,omitempty"`    // permits asked of a Semaphore
	// WaitedMillis is how long the waiter has been queued (server time),
	// -1 when the layout does not record it.
	WaitedMillis int64 `json:"waited_ms"`
	// PlaceMillis is how long its place lasts unless it retries.
	PlaceMillis int64 `json:"place_ttl_ms"`
}

// A primitive is how inspect finds and reads one kind of primitive of a name.
type primitive struct {
	mode string
	key  string   // the main key, reported as lockState.Key
	in   []string // the name carries the primitive when one of these exists
	read func(ctx context.Context, rdb redis.UniversalClient, st *lockState) error
}

// primitives lists every kind of primitive that name under prefix may
// carry, and the bookkeeping that may be left when nothing is held: its
// fence hashes, which hold the last fencing token, and its call ids.
func primitives(prefix, name string) (prims []primitive, fences, calls []string) {
	mk := keys.ForMutex(prefix, name)
	rk := keys.ForRWMutex(prefix, name)
	sk := keys.ForSemaphore(prefix, name)
	ok := keys.ForOnce(prefix, name)
	return []primitive{
		{mode: "mutex", key: mk.Lock, in: []string{mk.Lock, mk.Queue},
			read: func(ctx context.Context, rdb redis.UniversalClient, st *lockState) error {
				return readMutex(ctx, rdb, mk, st)
			}},
		{mode: "rwmutex", key: rk.Writer, in: []string{rk.Writer, rk.Readers, rk.WaitingWriters, rk.WaitingReaders},
			read: func(ctx context.Context, rdb redis.UniversalClient, st *lockState) error {
				return readRWMutex(ctx, rdb, rk, st)
			}},
		{mode: "semaphore", key: sk.State, in: []string{sk.State, sk.Holders, sk.Queue},
			read: func(ctx context.Context, rdb redis.UniversalClient, st *lockState) error {
				return readSemaphore(ctx, rdb, sk, st)
			}},
		{mode: "once", key: ok.Run, in: []string{ok.Run, ok.Done},
			read: func(ctx context.Context, rdb redis.UniversalClient, st *lockState) error {
				return readOnce(ctx, rdb, ok, st)
			}},
	}, []string{mk.Fence, rk.Fence}, []string{mk.Calls, rk.Calls, sk.Calls, ok.Calls} // sk.Fence is mk.Fence
}

// inspect reads the state of every primitive under name; with none, one
// state says "free" (bookkeeping is left) or "absent". It changes nothing.
func inspect(ctx context.Context, rdb redis.UniversalClient, prefix, name string) ([]*lockState, error) {
	prims, fences, calls := primitives(prefix, name)
	var probe []string
	for _, p := range prims {
		probe = append(probe, p.in...)
	}
	probe = append(append(probe, fences...), calls...)
	pipe := rdb.Pipeline()
	exists := make(map[string]*redis.IntCmd, len(probe))
	for _, k := range probe {
		exists[k] = pipe.Exists(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	present := func(k string) bool { return exists[k].Val() > 0 }
	newState := func(mode, key string) *lockState {
		return &lockState{Name: name, Key: key, Mode: mode, State: "free", TTLMillis: -1,
			Holders: []holder{}, Waiters: []waiter{}}
	}
	var out []*lockState
	for _, p := range prims {
		if !slices.ContainsFunc(p.in, present) {
			continue
		}
		st := newState(p.mode, p.key)
		if err := p.read(ctx, rdb, st); err != nil {
			return nil, fmt.Errorf("%s %s: %w", p.mode, name, err)
		}
		out = append(out, st)
	}
	if len(out) > 0 {
		return out, nil
	}
	st := newState("", keys.Base(prefix, name))
	st.State = "absent"
	if slices.ContainsFunc(calls, present) {
		st.State = "free"
	}
	for _, k := range fences {
		if present(k) {
			st.State = "free"
			n, err := rdb.HGet(ctx, k, "n").Uint64()
			if err != nil && !errors.Is(err, redis.Nil) {
				return nil, err
			}
			st.LastFence = max(st.LastFence, n)
		}
	}
	return []*lockState{st}, nil
}

// pttl converts a PTTL reply: -1 for none.
func pttl(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}

// placeLeft returns how long a place with the queue data d ("<deadline ms>
// ...") lasts at server time nowMS, or -1.
func placeLeft(d string, nowMS int64) int64 {
	f := strings.Fields(d)
	if len(f) == 0 {
		return -1
	}
	dl, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return -1
	}
	return max(dl-nowMS, 0)
}

// ownerCounts turns a lock hash into holders, skipping the ':' fields.
func ownerCounts(fields map[string]string, kind string) []holder {
	var hs []holder
	for f, v := range fields {
		if strings.HasPrefix(f, ":") {
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		hs = append(hs, holder{Owner: f, Count: n, Kind: kind})
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].Owner < hs[j].Owner })
	return hs
}

// readMutex reads a Mutex: two round trips, the second only for waiters.
func readMutex(ctx context.Context, rdb redis.UniversalClient, k keys.Mutex, st *lockState) error {
	pipe := rdb.Pipeline()
	fields := pipe.HGetAll(ctx, k.Lock)
	ttl := pipe.PTTL(ctx, k.Lock)
	last := pipe.HGet(ctx, k.Fence, "n")
	total := pipe.ZCard(ctx, k.Queue)
	queue := pipe.ZRangeWithScores(ctx, k.Queue, 0, maxShown-1)
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	st.Holders = append(st.Holders, ownerCounts(fields.Val(), "")...)
	st.Fence, _ = strconv.ParseUint(fields.Val()[":f"], 10, 64)
	_, st.Contended = fields.Val()[":w"]
	if len(st.Holders) > 0 {
		st.State = "held"
		st.TTLMillis = pttl(ttl.Val())
	}
	st.LastFence, _ = strconv.ParseUint(last.Val(), 10, 64)
	st.WaitersTotal = total.Val()
	zs := queue.Val()
	if len(zs) == 0 {
		return nil
	}
	toks := make([]string, len(zs))
	for i, z := range zs {
		toks[i], _ = z.Member.(string)
	}
	data, err := rdb.HMGet(ctx, k.QueueData, toks...).Result()
	if err != nil {
		return err
	}
	nowUS := now.Val().UnixMicro()
	for i, z := range zs {
		w := waiter{Owner: toks[i], WaitedMillis: (nowUS - int64(z.Score)) / 1000, PlaceMillis: -1}
		if s, ok := data[i].(string); ok {
			w.PlaceMillis = placeLeft(s, nowUS/1000)
		}
		st.Waiters = append(st.Waiters, w)
	}
	return nil
}

// readRWMutex reads an RWMutex: two round trips, the second only for readers.
func readRWMutex(ctx context.Context, rdb redis.UniversalClient, k keys.RWMutex, st *lockState) error {
	pipe := rdb.Pipeline()
	fields := pipe.HGetAll(ctx, k.Writer)
	ttl := pipe.PTTL(ctx, k.Writer)
	last := pipe.HGet(ctx, k.Fence, "n")
	readers := pipe.ZRangeWithScores(ctx, k.Readers, 0, maxShown-1)
	writers := pipe.ZRangeWithScores(ctx, k.WaitingWriters, 0, maxShown-1)
	nWriters := pipe.ZCard(ctx, k.WaitingWriters)
	queued := pipe.ZRangeWithScores(ctx, k.WriterQueue, 0, maxShown-1)
	nReaders := pipe.HLen(ctx, k.WaitingReaders)
	waitingReaders := pipe.HScan(ctx, k.WaitingReaders, 0, "", maxShown)
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	nowUS := now.Val().UnixMicro()
	nowMS := nowUS / 1000
	st.Holders = append(st.Holders, ownerCounts(fields.Val(), "write")...)
	if len(st.Holders) > 0 {
		st.TTLMillis = pttl(ttl.Val())
		st.Fence, _ = strconv.ParseUint(fields.Val()[":f"], 10, 64)
	}
	st.LastFence, _ = strconv.ParseUint(last.Val(), 10, 64)
	if zs := readers.Val(); len(zs) > 0 {
		toks := make([]string, len(zs))
		for i, z := range zs {
			toks[i], _ = z.Member.(string)
		}
		counts, err := rdb.HMGet(ctx, k.ReaderData, toks...).Result()
		if err != nil {
			return err
		}
		for i, z := range zs {
			h := holder{Owner: toks[i], Count: 1, Kind: "read", TTLMillis: max(int64(z.Score)-nowMS, 0)}
			if s, ok := counts[i].(string); ok {
				if f := strings.Fields(s); len(f) > 0 {
					h.Count, _ = strconv.ParseInt(f[0], 10, 64)
				}
			}
			st.Holders = append(st.Holders, h)
		}
	}
	if len(st.Holders) > 0 {
		st.State = "held"
	}
	// A writer that waited past the starvation threshold is queued, with
	// its arrival time.
	arrived := map[string]int64{}
	for _, z := range queued.Val() {
		tok, _ := z.Member.(string)
		arrived[tok] = int64(z.Score)
	}
	for _, z := range writers.Val() {
		tok, _ := z.Member.(string)
		w := waiter{Owner: tok, Kind: "write", WaitedMillis: -1, PlaceMillis: max(int64(z.Score)-nowMS, 0)}
		if a, ok := arrived[tok]; ok {
			w.WaitedMillis = (nowUS - a) / 1000
		}
		st.Waiters = append(st.Waiters, w)
	}
	kv, _ := waitingReaders.Val()
	for i := 0; i+1 < len(kv) && len(st.Waiters) < 2*maxShown; i += 2 {
		st.Waiters = append(st.Waiters, waiter{Owner: kv[i], Kind: "read", WaitedMillis: -1, PlaceMillis: placeLeft(kv[i+1], nowMS)})
	}
	st.WaitersTotal = nWriters.Val() + nReaders.Val()
	return nil
}

// readSemaphore reads a Semaphore: two round trips, the second only for
// waiters.
func readSemaphore(ctx context.Context, rdb redis.UniversalClient, k keys.Semaphore, st *lockState) error {
	pipe := rdb.Pipeline()
	holders := pipe.ZRangeWithScores(ctx, k.Holders, 0, maxShown-1)
	size := pipe.HGet(ctx, k.State, ":size")
	used := pipe.HGet(ctx, k.State, ":used")
	last := pipe.HGet(ctx, k.Fence, "n")
	total := pipe.ZCard(ctx, k.Queue)
	queue := pipe.ZRangeWithScores(ctx, k.Queue, 0, maxShown-1)
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	nowUS := now.Val().UnixMicro()
	nowMS := nowUS / 1000
	st.Size, _ = strconv.ParseInt(size.Val(), 10, 64)
	st.Used, _ = strconv.ParseInt(used.Val(), 10, 64)
	st.LastFence, _ = strconv.ParseUint(last.Val(), 10, 64)
	st.WaitersTotal = total.Val()
	hs := holders.Val()
	var fields []string
	for _, z := range hs {
		tok, _ := z.Member.(string)
		fields = append(fields, tok, ":f:"+tok)
	}
	qs := queue.Val()
	ids := make([]string, len(qs))
	for i, z := range qs {
		ids[i], _ = z.Member.(string)
	}
	pipe = rdb.Pipeline()
	var vals *redis.SliceCmd
	var data *redis.SliceCmd
	if len(fields) > 0 {
		vals = pipe.HMGet(ctx, k.State, fields...)
	}
	if len(ids) > 0 {
		data = pipe.HMGet(ctx, k.QueueData, ids...)
	}
	if len(fields)+len(ids) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	for i, z := range hs {
		h := holder{Owner: fields[2*i], TTLMillis: max(int64(z.Score)-nowMS, 0)}
		v := vals.Val()
		if s, ok := v[2*i].(string); ok {
			h.Count, _ = strconv.ParseInt(s, 10, 64)
		}
		if s, ok := v[2*i+1].(string); ok {
			h.Fence, _ = strconv.ParseUint(s, 10, 64)
		}
		st.Holders = append(st.Holders, h)
	}
	if len(st.Holders) > 0 {
		st.State = "held"
	}
	for i, z := range qs {
		w := waiter{Owner: ids[i], WaitedMillis: (nowUS - int64(z.Score)) / 1000, PlaceMillis: -1}
		if s, ok := data.Val()[i].(string); ok {
			w.PlaceMillis = placeLeft(s, nowMS)
			// "<place deadline ms> <ttl ms> <n> <secret> <token>"
			if f := strings.Fields(s); len(f) == 5 {
				w.N, _ = strconv.ParseInt(f[2], 10, 64)
				w.Owner = f[4]
			}
		}
		st.Waiters = append(st.Waiters, w)
	}
	return nil
}

// readOnce reads a Once: one round trip.
func readOnce(ctx context.Context, rdb redis.UniversalClient, k keys.Once, st *lockState) error {
	pipe := rdb.Pipeline()
	runner := pipe.HGet(ctx, k.Run, "t")
	ttl := pipe.PTTL(ctx, k.Run)
	value := pipe.HGet(ctx, k.Done, "v")
	doneTTL := pipe.PTTL(ctx, k.Done)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	st.State = "idle"
	if value.Err() == nil {
		st.State, st.Done = "done", true
		st.ValueBytes = len(value.Val())
		st.DoneTTLMillis = pttl(doneTTL.Val())
	}
	if runner.Err() == nil && runner.Val() != "" {
		st.State = "running"
		st.Holders = append(st.Holders, holder{Owner: runner.Val(), Count: 1})
		st.TTLMillis = pttl(ttl.Val())
	}
	return nil
}

// scanNames returns the names under prefix that match the glob pattern,
// at most limit of them, scanning every master of a cluster. It reports
// whether it stopped early. SCAN's MATCH narrows the keys the server sends
// where it can (see keys.Match); the names are then matched here, since an
// encoded name's keys do not contain the name.
func scanNames(ctx context.Context, rdb redis.UniversalClient, prefix, pattern string, limit int) ([]string, bool, error) {
	match := keys.Match(prefix, pattern)
	seen := map[string]bool{}
	var names []string
	truncated := false
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for range maxScanCalls {
			ks, next, err := c.Scan(ctx, cursor, match, scanCount).Result()
			if err != nil {
				return err
			}
			for _, k := range ks {
				n, ok := keys.Name(prefix, k)
				if !ok || seen[n] || !globMatch(pattern, n) {
					continue
				}
				if len(names) >= limit {
					truncated = true
					return nil
				}
				seen[n] = true
				names = append(names, n)
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
		truncated = true
		return nil
	}
	var err error
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		// Masters are scanned one after the other, so names needs no lock;
		// ForEachMaster calls its function on all of them at once.
		var mu sync.Mutex
		var masters []*redis.Client
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			masters = append(masters, c)
			return nil
		})
		for _, c := range masters {
			if err == nil {
				err = scan(ctx, c)
			}
		}
	} else {
		err = scan(ctx, rdb)
	}
	sort.Strings(names)
	return names, truncated, err
}

// globMatch reports whether s matches the glob pattern p as Redis's MATCH
// does, byte by byte: '*' any bytes, '?' one byte, "[abc]", "[^a-z]" one
// byte of a set (or not of it), '\' quotes the next byte.
func globMatch(p, s string) bool {
	for len(p) > 0 && len(s) > 0 {
		switch p[0] {
		case '*':
			for len(p) > 1 && p[1] == '*' {
				p = p[1:]
			}
			if len(p) == 1 {
				return true
			}
			for i := range len(s) {
				if globMatch(p[1:], s[i:]) {
					return true
				}
			}
			return false
		case '?':
			p, s = p[1:], s[1:]
		case '[':
			p = p[1:]
			not := len(p) > 0 && p[0] == '^'
			if not {
				p = p[1:]
			}
			match := false
			for len(p) > 0 && p[0] != ']' {
				switch {
				case p[0] == '\\' && len(p) >= 2:
					p = p[1:]
					match = match || p[0] == s[0]
				case len(p) >= 3 && p[1] == '-':
					lo, hi := min(p[0], p[2]), max(p[0], p[2])
					match = match || (lo <= s[0] && s[0] <= hi)
					p = p[2:]
				default:
					match = match || p[0] == s[0]
				}
				p = p[1:]
			}
			if match == not {
				return false
			}
			if len(p) > 0 {
				p = p[1:] // the closing ']'; without one the set ends the pattern
			}
			s = s[1:]
		case '\\':
			if len(p) >= 2 {
				p = p[1:]
			}
			fallthrough
		default:
			if p[0] != s[0] {
				return false
			}
			p, s = p[1:], s[1:]
		}
	}
	for len(s) == 0 && len(p) > 0 && p[0] == '*' {
		p = p[1:]
	}
	return len(p) == 0 && len(s) == 0
}
