package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
)

// The key layouts of dsync's primitives, read without changing anything.
// Everything this command knows about how a primitive stores its state is in
// this file: the names of its keys (all of them begin with the base key
// "<prefix>:{<name>}", so they share one cluster slot) and what their fields
// mean. One name may carry several primitives at once (a Mutex and a Once
// called "x" are independent). To support another layout, add it to layouts.
//
// Mutex (lua/mutex_lock.lua):
//
//	<base>           hash  <owner> -> reentry count; ':f' fencing token of the hold,
//	                       ':c' last call id, ':w' set once someone waited; PTTL = lease
//	<base>:f         hash  'n' last fencing token of the name (shared with Semaphore)
//	<base>:q         zset  waiter token -> arrival (server µs)
//	<base>:qd        hash  waiter token -> "<place deadline ms> <ttl ms> <call id>"
//
// RWMutex (lua/rwmutex_lock.lua):
//
//	<base>:rw        hash  writer <owner> -> reentry count; ':f' fencing token; PTTL = lease
//	<base>:rw:f      hash  'n' last fencing token
//	<base>:rw:r      zset  reader token -> lease deadline (server ms)
//	<base>:rw:rc     hash  reader token -> "<reentry count> <hold id> <call ids>"
//	<base>:rw:ww     zset  waiting writer token -> place deadline (ms)
//	<base>:rw:rq     hash  waiting reader token -> "<place deadline ms> <ttl ms> <call id>"
//	<base>:rw:x      zset  call ids of the replay window (lua/lib.lua)
//	<base>:rw:wq     zset  queued writer token -> arrival (server µs)
//	<base>:rw:wd     hash  queued writer token -> "<ttl ms> <call id>"
//
// Semaphore (lua/semaphore_lib.lua):
//
//	<base>:s         hash  ':size', ':used', <holder> -> permits, ':f:'<holder> -> fencing token
//	<base>:sh        zset  holder token -> lease deadline (server ms)
//	<base>:sq        zset  call id -> arrival (server µs)
//	<base>:sqd       hash  call id -> "<place deadline ms> <ttl ms> <n> <token>"
//	<base>:sx        zset  call ids of the replay window (lua/lib.lua)
//
// Once (lua/once_do.lua):
//
//	<base>:once      hash  't' token of the running call; PTTL = run lease
//	<base>:once:done hash  'v' the value, 't' the token of the run that succeeded;
//	                       PTTL = period left (none: kept until reset)

const (
	maxShown     = 100    // holders and waiters read per primitive
	scanCount    = 1000   // COUNT hint of each SCAN call
	maxScanCalls = 10_000 // SCAN calls per node before list gives up
	defaultLimit = 1000   // names list shows at most, by default
)

// lockState is what inspect and list report about one primitive.
type lockState struct {
	Name string `json:"name"`
	Key  string `json:"key"` // the primitive's main key
	// Mode is the primitive: "mutex", "rwmutex", "semaphore" or "once";
	// "" when only a fencing counter is left, or no key exists at all.
	Mode string `json:"mode"`
	// State is "held" (mutex, rwmutex, semaphore), "running", "done" or
	// "idle" (once), "free" (nothing held; a fencing counter may be left) or
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
	// Contended reports that someone waited during the current Mutex hold.
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

// A layout reads the state of one primitive's keys.
type layout struct {
	mode string
	// keys are the suffixes of the primitive's keys after the base key; a
	// name carries the primitive when one of the first primary exists.
	keys    []string
	primary int
	read    func(ctx context.Context, rdb redis.UniversalClient, base string, st *lockState) error
}

var layouts = []layout{
	{mode: "mutex", keys: []string{"", ":q", ":qd", ":f"}, primary: 2, read: readMutex},
	{mode: "rwmutex", keys: []string{":rw", ":rw:r", ":rw:ww", ":rw:rq", ":rw:rc", ":rw:f", ":rw:x", ":rw:wq", ":rw:wd"}, primary: 4, read: readRWMutex},
	{mode: "semaphore", keys: []string{":s", ":sh", ":sq", ":sqd", ":f"}, primary: 3, read: readSemaphore},
	{mode: "once", keys: []string{":once", ":once:done"}, primary: 2, read: readOnce},
}

// fenceKeys hold a name's last fencing token when nothing else is left.
var fenceKeys = []string{":f", ":rw:f"}

// allSuffixes is every key suffix of every layout, each once.
func allSuffixes() []string {
	seen := map[string]bool{}
	var out []string
	for _, l := range layouts {
		for _, s := range l.keys {
			if !seen[s] {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	return out
}

// baseKey returns the base key of name.
func baseKey(prefix, name string) string { return prefix + ":{" + name + "}" }

// nameOf returns the name whose key k is, or false if k is no dsync key
// under prefix.
func nameOf(prefix, k string) (string, bool) {
	rest, ok := strings.CutPrefix(k, prefix+":{")
	if !ok {
		return "", false
	}
	i := strings.LastIndex(rest, "}")
	if i < 0 || !slices.Contains(allSuffixes(), rest[i+1:]) {
		return "", false
	}
	return rest[:i], true
}

// inspect reads the state of every primitive under name; with none, one
// state says "free" (a fencing counter is left) or "absent". It changes
// nothing.
func inspect(ctx context.Context, rdb redis.UniversalClient, prefix, name string) ([]*lockState, error) {
	base := baseKey(prefix, name)
	suffixes := allSuffixes()
	pipe := rdb.Pipeline()
	exists := make([]*redis.IntCmd, len(suffixes))
	for i, s := range suffixes {
		exists[i] = pipe.Exists(ctx, base+s)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	present := map[string]bool{}
	for i, s := range suffixes {
		present[s] = exists[i].Val() > 0
	}
	newState := func(mode, key string) *lockState {
		return &lockState{Name: name, Key: key, Mode: mode, State: "free", TTLMillis: -1,
			Holders: []holder{}, Waiters: []waiter{}}
	}
	var out []*lockState
	for _, l := range layouts {
		in := false
		for _, s := range l.keys[:l.primary] {
			in = in || present[s]
		}
		if !in {
			continue
		}
		st := newState(l.mode, base+l.keys[0])
		if err := l.read(ctx, rdb, base, st); err != nil {
			return nil, fmt.Errorf("%s %s: %w", l.mode, name, err)
		}
		out = append(out, st)
	}
	if len(out) > 0 {
		return out, nil
	}
	st := newState("", base)
	st.State = "absent"
	for _, s := range fenceKeys {
		if present[s] {
			st.State = "free"
			n, err := rdb.HGet(ctx, base+s, "n").Uint64()
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
func readMutex(ctx context.Context, rdb redis.UniversalClient, base string, st *lockState) error {
	pipe := rdb.Pipeline()
	fields := pipe.HGetAll(ctx, base)
	ttl := pipe.PTTL(ctx, base)
	last := pipe.HGet(ctx, base+":f", "n")
	total := pipe.ZCard(ctx, base+":q")
	queue := pipe.ZRangeWithScores(ctx, base+":q", 0, maxShown-1)
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
	data, err := rdb.HMGet(ctx, base+":qd", toks...).Result()
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
func readRWMutex(ctx context.Context, rdb redis.UniversalClient, base string, st *lockState) error {
	k := base + ":rw"
	pipe := rdb.Pipeline()
	fields := pipe.HGetAll(ctx, k)
	ttl := pipe.PTTL(ctx, k)
	last := pipe.HGet(ctx, k+":f", "n")
	readers := pipe.ZRangeWithScores(ctx, k+":r", 0, maxShown-1)
	writers := pipe.ZRangeWithScores(ctx, k+":ww", 0, maxShown-1)
	nWriters := pipe.ZCard(ctx, k+":ww")
	queued := pipe.ZRangeWithScores(ctx, k+":wq", 0, maxShown-1)
	nReaders := pipe.HLen(ctx, k+":rq")
	waitingReaders := pipe.HScan(ctx, k+":rq", 0, "", maxShown)
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
		counts, err := rdb.HMGet(ctx, k+":rc", toks...).Result()
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
func readSemaphore(ctx context.Context, rdb redis.UniversalClient, base string, st *lockState) error {
	pipe := rdb.Pipeline()
	holders := pipe.ZRangeWithScores(ctx, base+":sh", 0, maxShown-1)
	size := pipe.HGet(ctx, base+":s", ":size")
	used := pipe.HGet(ctx, base+":s", ":used")
	last := pipe.HGet(ctx, base+":f", "n")
	total := pipe.ZCard(ctx, base+":sq")
	queue := pipe.ZRangeWithScores(ctx, base+":sq", 0, maxShown-1)
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	nowUS := now.Val().UnixMicro()
	nowMS := nowUS / 1000
	st.Key = base + ":s"
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
		vals = pipe.HMGet(ctx, base+":s", fields...)
	}
	if len(ids) > 0 {
		data = pipe.HMGet(ctx, base+":sqd", ids...)
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
			// "<place deadline ms> <ttl ms> <n> <token>"
			if f := strings.Fields(s); len(f) == 4 {
				w.N, _ = strconv.ParseInt(f[2], 10, 64)
				w.Owner = f[3]
			}
		}
		st.Waiters = append(st.Waiters, w)
	}
	return nil
}

// readOnce reads a Once: one round trip.
func readOnce(ctx context.Context, rdb redis.UniversalClient, base string, st *lockState) error {
	k := base + ":once"
	pipe := rdb.Pipeline()
	runner := pipe.HGet(ctx, k, "t")
	ttl := pipe.PTTL(ctx, k)
	value := pipe.HGet(ctx, k+":done", "v")
	doneTTL := pipe.PTTL(ctx, k+":done")
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
// whether it stopped early.
func scanNames(ctx context.Context, rdb redis.UniversalClient, prefix, pattern string, limit int) ([]string, bool, error) {
	match := globEscape(prefix) + ":{" + pattern + "}*"
	seen := map[string]bool{}
	var names []string
	truncated := false
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for range maxScanCalls {
			keys, next, err := c.Scan(ctx, cursor, match, scanCount).Result()
			if err != nil {
				return err
			}
			for _, k := range keys {
				n, ok := nameOf(prefix, k)
				if !ok || seen[n] {
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
		// Masters are scanned one after the other, so names needs no lock.
		var masters []*redis.Client
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
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

// globEscape quotes the glob characters of s for SCAN MATCH.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Output.

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func fmtMillis(ms int64) string {
	if ms < 0 {
		return "-"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

func fmtFence(f uint64) string {
	if f == 0 {
		return "-"
	}
	return strconv.FormatUint(f, 10)
}

// writeState prints one primitive in full.
func writeState(w io.Writer, st *lockState) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	mode := st.Mode
	if mode == "" {
		mode = "-"
	}
	fmt.Fprintf(tw, "name\t%s\n", st.Name)
	fmt.Fprintf(tw, "key\t%s\n", st.Key)
	fmt.Fprintf(tw, "mode\t%s\n", mode)
	fmt.Fprintf(tw, "state\t%s\n", st.State)
	if st.Size > 0 {
		fmt.Fprintf(tw, "permits\t%d of %d used\n", st.Used, st.Size)
	}
	for _, h := range st.Holders {
		what := fmt.Sprintf("count %d", h.Count)
		if st.Mode == "semaphore" {
			what = fmt.Sprintf("%d permits", h.Count)
		}
		if h.Kind != "" {
			what = h.Kind + ", " + what
		}
		if h.TTLMillis > 0 {
			what += ", lease " + fmtMillis(h.TTLMillis)
		}
		if h.Fence > 0 {
			what += ", fence " + fmtFence(h.Fence)
		}
		fmt.Fprintf(tw, "holder\t%s (%s)\n", h.Owner, what)
	}
	if st.TTLMillis >= 0 {
		fmt.Fprintf(tw, "ttl\t%s\n", fmtMillis(st.TTLMillis))
	}
	if st.Fence > 0 {
		fmt.Fprintf(tw, "fence\t%s\n", fmtFence(st.Fence))
	}
	if st.Mode != "once" {
		fmt.Fprintf(tw, "last fence\t%s\n", fmtFence(st.LastFence))
	}
	if st.Done {
		fmt.Fprintf(tw, "done\tvalue of %d bytes, mark lasts %s\n", st.ValueBytes, fmtMillis(st.DoneTTLMillis))
	}
	if st.Mode != "" && st.Mode != "once" {
		fmt.Fprintf(tw, "waiters\t%d queued\n", st.WaitersTotal)
	}
	for i, q := range st.Waiters {
		what := ""
		if q.Kind != "" {
			what = q.Kind + ", "
		}
		if q.N > 0 {
			what += fmt.Sprintf("%d permits, ", q.N)
		}
		if q.WaitedMillis >= 0 {
			what += "waited " + fmtMillis(q.WaitedMillis) + ", "
		}
		fmt.Fprintf(tw, "  %d.\t%s (%splace lasts %s)\n", i+1, q.Owner, what, fmtMillis(q.PlaceMillis))
	}
	if n := st.WaitersTotal - int64(len(st.Waiters)); n > 0 {
		fmt.Fprintf(tw, "  ...\t%d more\n", n)
	}
	tw.Flush()
}

// writeTable prints one line per primitive.
func writeTable(w io.Writer, sts []*lockState) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tMODE\tSTATE\tHOLDER\tCOUNT\tTTL\tFENCE\tWAITERS")
	for _, st := range sts {
		owner, count := "-", "-"
		if len(st.Holders) > 0 {
			owner = st.Holders[0].Owner
			count = strconv.FormatInt(st.Holders[0].Count, 10)
			if len(st.Holders) > 1 {
				owner += fmt.Sprintf(" (+%d)", len(st.Holders)-1)
			}
		}
		mode := st.Mode
		if mode == "" {
			mode = "-"
		}
		fence := st.Fence
		if fence == 0 {
			fence = st.LastFence
		}
		ttl := st.TTLMillis
		if ttl < 0 && len(st.Holders) > 0 {
			ttl = st.Holders[0].TTLMillis
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", st.Name, mode, st.State, owner, count,
			fmtMillis(ttl), fmtFence(fence), st.WaitersTotal)
	}
	tw.Flush()
}

// Commands.

const inspectHead = `Usage: dsync inspect [flags] NAME

Shows, without changing anything, every primitive found under NAME (a
Mutex, RWMutex, Semaphore and Once of one name are independent): its mode
(mutex, rwmutex, semaphore, once), state (held; running, done or idle for a
Once; free when only a fencing counter is left; absent), holders (owner
token with reentry count, read/write kind, or permits), lease TTL left,
fencing token of the hold and the last one given out, and waiters (owner,
time queued, how long the place lasts). Tokens of holders started by
"dsync run" read HOST/PID/RANDOM.

Mutex waiters appear from their first refused attempt, when they join the
lock's queue; RWMutex writers once they have waited past 1 ms; waiters of a
Once are not recorded.
`

const inspectTail = `Exit status: 0 (also for a name that is free or absent), 1 on an error,
2 on bad usage.

-json prints an array with one object per primitive (one object with mode ""
when there is none): name, key, mode, state, holders [{owner, count, kind,
ttl_ms, fence}], ttl_ms (-1: none), fence, last_fence, contended, size, used,
done, value_bytes, done_ttl_ms, waiters [{owner, kind, n, waited_ms (-1:
unknown), place_ttl_ms}], waiters_total. Fields that do not apply are left
out.
`

func cmdInspect(args []string, stdout, stderr io.Writer) int {
	var c conn
	fs := newFlagSet("inspect", inspectHead, inspectTail, stdout)
	c.register(fs, defaultURL)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if code, done := parse(fs, args, stderr); done {
		return code
	}
	if fs.NArg() != 1 {
		return usageErr(stderr, "inspect", "want exactly one NAME, got %d arguments", fs.NArg())
	}
	name := fs.Arg(0)
	if name == "" {
		return usageErr(stderr, "inspect", "empty NAME")
	}
	ctx := context.Background()
	rdb, _, err := c.dial(ctx, c.resolved(defaultURL))
	if err != nil {
		return fail(stderr, "inspect", exitError, err)
	}
	defer rdb.Close()
	sts, err := inspect(ctx, rdb, c.prefix, name)
	if err != nil {
		return fail(stderr, "inspect", exitError, err)
	}
	if *asJSON {
		if err := writeJSON(stdout, sts); err != nil {
			return fail(stderr, "inspect", exitError, err)
		}
		return exitOK
	}
	for i, st := range sts {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		writeState(stdout, st)
	}
	return exitOK
}

const listHead = `Usage: dsync list [flags] [PATTERN]

Lists the primitives whose names match the glob PATTERN (default *, Redis
MATCH syntax), one line each: name, mode, state, first holder, its reentry
count (permits for a semaphore), lease TTL left, fencing token (of the hold,
else the last one given out) and waiters. Without -all only primitives in
use are listed (held, running, waited for); -all adds idle ones: a Once that
is done or idle, a name that only keeps its fencing counter.

Keys are found with SCAN (on every master of a cluster), never KEYS: at most
-limit names, and at most 10000 SCAN calls per node.
`

const listTail = `Exit status: 0, 1 on an error, 2 on bad usage; a note on stderr says when
the list was cut short. -json prints an array of the objects "dsync inspect
-json" prints.
`

func cmdList(args []string, stdout, stderr io.Writer) int {
	var c conn
	fs := newFlagSet("list", listHead, listTail, stdout)
	c.register(fs, defaultURL)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	all := fs.Bool("all", false, "also list idle primitives (free, done) and names that only keep a fencing counter")
	limit := fs.Int("limit", defaultLimit, "list at most `n` names")
	if code, done := parse(fs, args, stderr); done {
		return code
	}
	if fs.NArg() > 1 {
		return usageErr(stderr, "list", "want at most one PATTERN, got %d arguments", fs.NArg())
	}
	if *limit < 1 {
		return usageErr(stderr, "list", "-limit %d, want at least 1", *limit)
	}
	pattern := "*"
	if fs.NArg() == 1 && fs.Arg(0) != "" {
		pattern = fs.Arg(0)
	}
	ctx := context.Background()
	rdb, _, err := c.dial(ctx, c.resolved(defaultURL))
	if err != nil {
		return fail(stderr, "list", exitError, err)
	}
	defer rdb.Close()
	names, truncated, err := scanNames(ctx, rdb, c.prefix, pattern, *limit)
	if err != nil {
		return fail(stderr, "list", exitError, err)
	}
	sts := []*lockState{}
	for _, n := range names {
		got, err := inspect(ctx, rdb, c.prefix, n)
		if err != nil {
			return fail(stderr, "list", exitError, fmt.Errorf("%s: %w", n, err))
		}
		for _, st := range got {
			busy := st.State == "held" || st.State == "running" || st.WaitersTotal > 0
			if st.State == "absent" || (!*all && !busy) {
				continue
			}
			sts = append(sts, st)
		}
	}
	if truncated {
		fmt.Fprintf(stderr, "dsync list: stopped after %d names; narrow PATTERN or raise -limit\n", len(names))
	}
	if *asJSON {
		if err := writeJSON(stdout, sts); err != nil {
			return fail(stderr, "list", exitError, err)
		}
		return exitOK
	}
	writeTable(stdout, sts)
	return exitOK
}
