package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
// mean. To support another primitive, add a layout to layouts.
//
// Mutex (see lua/mutex_lock.lua):
//
//	<base>      hash  <owner token> -> reentry count; ':f' fencing token of the
//	                  hold, ':c' last call id, ':w' set once someone waited;
//	                  its PTTL is the lease left
//	<base>:f    hash  'n' last fencing token given out under the name (idle expiry)
//	<base>:q    zset  waiter token -> arrival time (server µs)
//	<base>:qd   hash  waiter token -> "<place deadline ms> <ttl ms> <call id>"

const (
	maxWaitersShown = 100    // waiters read per lock
	scanCount       = 1000   // COUNT hint of each SCAN call
	maxScanCalls    = 10_000 // SCAN calls per node before list gives up
	defaultLimit    = 1000   // locks list shows at most, by default
)

// lockState is what inspect and list report about one name.
type lockState struct {
	Name string `json:"name"`
	Key  string `json:"key"`
	// Mode is the primitive found under the name ("mutex"), "" when no key
	// of the name exists, or "unknown" for keys this command cannot read.
	Mode string `json:"mode"`
	// State is "held", "free" (nothing held, maybe a fencing counter left)
	// or "absent" (no key at all).
	State   string   `json:"state"`
	Holders []holder `json:"holders"`
	// TTLMillis is the lease left of the current hold, -1 when none.
	TTLMillis int64 `json:"ttl_ms"`
	// Fence is the fencing token of the current hold; LastFence the last
	// token given out under the name (it survives the hold).
	Fence     uint64 `json:"fence,omitempty"`
	LastFence uint64 `json:"last_fence,omitempty"`
	// Contended reports that someone waited during the current hold.
	Contended bool     `json:"contended"`
	Waiters   []waiter `json:"waiters"`
	// WaitersTotal counts every queued waiter; Waiters lists the first
	// maxWaitersShown. Waiters that have not yet waited past the starvation
	// threshold are not queued and not counted.
	WaitersTotal int64  `json:"waiters_total"`
	Detail       string `json:"detail,omitempty"`
}

type holder struct {
	Owner string `json:"owner"`
	Count int64  `json:"count"`
}

type waiter struct {
	Owner string `json:"owner"`
	// WaitedMillis is how long the waiter has been queued (server time).
	WaitedMillis int64 `json:"waited_ms"`
	// PlaceMillis is how long its place lasts unless it retries.
	PlaceMillis int64 `json:"place_ttl_ms"`
}

// A layout reads the state of one primitive's keys.
type layout struct {
	mode     string
	suffixes []string // keys besides the base key
	// match reports whether the keys present (base key type, suffix keys
	// that exist) are this layout's.
	match func(baseType string, present map[string]bool) bool
	read  func(ctx context.Context, rdb redis.UniversalClient, base string, st *lockState) error
}

var layouts = []layout{mutexLayout}

var mutexLayout = layout{
	mode:     "mutex",
	suffixes: []string{":f", ":q", ":qd"},
	match: func(baseType string, present map[string]bool) bool {
		return baseType == "hash" || baseType == "none"
	},
	read: readMutex,
}

// allSuffixes is every suffix key of every layout.
func allSuffixes() []string {
	seen := map[string]bool{}
	var out []string
	for _, l := range layouts {
		for _, s := range l.suffixes {
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
	if i < 0 {
		return "", false
	}
	suffix := rest[i+1:]
	if suffix != "" {
		known := false
		for _, s := range allSuffixes() {
			known = known || s == suffix
		}
		if !known {
			return "", false
		}
	}
	return rest[:i], true
}

// inspect reads the state of name. It changes nothing.
func inspect(ctx context.Context, rdb redis.UniversalClient, prefix, name string) (*lockState, error) {
	base := baseKey(prefix, name)
	st := &lockState{Name: name, Key: base, TTLMillis: -1, Holders: []holder{}, Waiters: []waiter{}}
	suffixes := allSuffixes()
	pipe := rdb.Pipeline()
	typ := pipe.Type(ctx, base)
	exists := make([]*redis.IntCmd, len(suffixes))
	for i, s := range suffixes {
		exists[i] = pipe.Exists(ctx, base+s)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	present := map[string]bool{}
	found := typ.Val() != "none"
	for i, s := range suffixes {
		if exists[i].Val() > 0 {
			present[s] = true
			found = true
		}
	}
	if !found {
		st.State = "absent"
		return st, nil
	}
	for _, l := range layouts {
		if l.match(typ.Val(), present) {
			st.Mode = l.mode
			if err := l.read(ctx, rdb, base, st); err != nil {
				return nil, err
			}
			return st, nil
		}
	}
	st.Mode, st.State = "unknown", "unknown"
	st.Detail = fmt.Sprintf("key %s is a %s", base, typ.Val())
	return st, nil
}

// readMutex reads a Mutex: two round trips, the second only for waiters.
func readMutex(ctx context.Context, rdb redis.UniversalClient, base string, st *lockState) error {
	pipe := rdb.Pipeline()
	fields := pipe.HGetAll(ctx, base)
	pttl := pipe.PTTL(ctx, base)
	last := pipe.HGet(ctx, base+":f", "n")
	total := pipe.ZCard(ctx, base+":q")
	queue := pipe.ZRangeWithScores(ctx, base+":q", 0, maxWaitersShown-1)
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	for f, v := range fields.Val() {
		switch {
		case f == ":f":
			st.Fence, _ = strconv.ParseUint(v, 10, 64)
		case f == ":w":
			st.Contended = true
		case strings.HasPrefix(f, ":"):
			// bookkeeping (the last call id)
		default:
			n, _ := strconv.ParseInt(v, 10, 64)
			st.Holders = append(st.Holders, holder{Owner: f, Count: n})
		}
	}
	sort.Slice(st.Holders, func(i, j int) bool { return st.Holders[i].Owner < st.Holders[j].Owner })
	st.State = "free"
	if len(st.Holders) > 0 {
		st.State = "held"
		st.TTLMillis = pttl.Val().Milliseconds()
		if pttl.Val() < 0 {
			st.TTLMillis = -1
		}
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
			if dl, err := strconv.ParseInt(strings.Fields(s)[0], 10, 64); err == nil {
				w.PlaceMillis = max(dl-nowUS/1000, 0)
			}
		}
		st.Waiters = append(st.Waiters, w)
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

// writeState prints one lock in full.
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
	if st.Detail != "" {
		fmt.Fprintf(tw, "detail\t%s\n", st.Detail)
	}
	for _, h := range st.Holders {
		fmt.Fprintf(tw, "holder\t%s (count %d)\n", h.Owner, h.Count)
	}
	if st.State == "held" {
		fmt.Fprintf(tw, "ttl\t%s\n", fmtMillis(st.TTLMillis))
		fmt.Fprintf(tw, "fence\t%s\n", fmtFence(st.Fence))
	}
	fmt.Fprintf(tw, "last fence\t%s\n", fmtFence(st.LastFence))
	fmt.Fprintf(tw, "waiters\t%d queued\n", st.WaitersTotal)
	for i, q := range st.Waiters {
		fmt.Fprintf(tw, "  %d.\t%s (waited %s, place lasts %s)\n", i+1, q.Owner, fmtMillis(q.WaitedMillis), fmtMillis(q.PlaceMillis))
	}
	if n := st.WaitersTotal - int64(len(st.Waiters)); n > 0 {
		fmt.Fprintf(tw, "  ...\t%d more\n", n)
	}
	tw.Flush()
}

// writeTable prints one line per lock.
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
		if st.State != "held" {
			fence = st.LastFence
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", st.Name, mode, st.State, owner, count,
			fmtMillis(st.TTLMillis), fmtFence(fence), st.WaitersTotal)
	}
	tw.Flush()
}

// Commands.

const inspectHead = `Usage: dsync inspect [flags] NAME

Shows the state of the lock NAME without changing it: mode (mutex), state
(held, free, absent), holders (owner token and reentry count), lease TTL
left, fencing token of the hold and the last one given out, and the queued
waiters (owner, time queued, how long the place lasts). Tokens of holders
started by "dsync run" read HOST/PID/RANDOM.

Waiters appear once they have waited past the starvation threshold (1 ms)
and joined the lock's queue.
`

const inspectTail = `Exit status: 0 (also for a lock that is free or absent), 1 on an error,
2 on bad usage. -json prints one object with the fields name, key, mode,
state, holders [{owner, count}], ttl_ms (-1: none), fence, last_fence,
contended, waiters [{owner, waited_ms, place_ttl_ms}], waiters_total.
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
	st, err := inspect(ctx, rdb, c.prefix, name)
	if err != nil {
		return fail(stderr, "inspect", exitError, err)
	}
	if *asJSON {
		if err := writeJSON(stdout, st); err != nil {
			return fail(stderr, "inspect", exitError, err)
		}
		return exitOK
	}
	writeState(stdout, st)
	return exitOK
}

const listHead = `Usage: dsync list [flags] [PATTERN]

Lists the locks whose names match the glob PATTERN (default *, Redis MATCH
syntax), one line each: name, mode, state, first holder, its reentry count,
lease TTL left, fencing token (of the hold, else the last one given out) and
queued waiters. Without -all only locks that are held or have waiters are
listed; -all adds names that only keep their fencing counter.

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
	all := fs.Bool("all", false, "also list free locks that only keep a fencing counter")
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
		st, err := inspect(ctx, rdb, c.prefix, n)
		if err != nil {
			return fail(stderr, "list", exitError, fmt.Errorf("%s: %w", n, err))
		}
		if st.State == "absent" || (!*all && st.State == "free" && st.WaitersTotal == 0) {
			continue
		}
		sts = append(sts, st)
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
