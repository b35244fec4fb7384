package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dsync-go/dsync"
	"github.com/dsync-go/dsync/internal/luasrc"
	"github.com/dsync-go/dsync/internal/redistest"
	"github.com/dsync-go/dsync/lua"
)

// BenchmarkServerTime reports the server's time per call of each hot
// script, next to the raw floor's SET NX PX and compare-and-delete script
// (floor_set, floor_del), in two ways:
//
//   - <script>-µs: each call timed alone by the server's SLOWLOG (threshold
//     0), per script. SLOWLOG then logs a script's inner redis.calls too,
//     inside the script's time, so these read a little high for scripts
//     that make many calls.
//   - <operation>-µs/pair: INFO commandstats with SLOWLOG off, the server's
//     time for the scripts (or commands) of one Lock+Unlock pair of the
//     operation (Do for a Once on a new name).
//
// Two more operations split a Mutex pair's time into its parts: noop
// runs two scripts that return at once, called with the KEYS and ARGV
// of an uncontended Mutex Lock and Unlock (what any script with those
// arguments costs), and bare runs two scripts that make the same
// redis.calls as that pair, on keys of the same shape, with none of the
// scripts' checks (what the commands cost); bare_noids makes them but
// for the call ids' (the lock's look-up of its id, and each script's
// note of its id and the expiry that goes with it), so that bare less
// bare_noids is what the call-id records cost. The rest of the mutex
// figure is the scripts' own Lua: the definitions each call makes and
// the checks.
//
// Each round runs every operation in turn, serverTimeCalls pairs each;
// a round's figure is the mean of the middle half of its calls (SLOWLOG
// counts whole µs), and the reported one is the median over the rounds, so
// that a slow spell on a shared machine hits every script alike. The
// server's settings are restored at the end. Run it with -benchtime 1x:
// b.N does not change what it measures.
//
// With $DSYNC_SERVER_TIME_BASE naming a directory of other versions of the
// scripts (lib.lua, the *_lib.lua files and the hot scripts, with the same
// KEYS and ARGV), put together as lua.Source puts dsync's together (only
// the definitions of lib.lua a script uses), each round also runs every
// operation on those, reported
// with the prefix "base:", so that a change is measured against what it
// replaces in one run, on the same keys, interleaved; <metric>-×base is
// then the median over the rounds of the ratio to the base's figure.
func BenchmarkServerTime(b *testing.B) {
	const rounds, calls = 11, 200
	ctx := context.Background()
	rdb := benchDial(b)(b)
	if _, ok := rdb.(*redis.ClusterClient); ok {
		b.Skip("server time is read from one server's SLOWLOG and INFO commandstats; " +
			"a cluster node runs each script as a single server does: measure it there")
	}
	c, _ := benchClient(b, dsync.FixedLease()) // no renewals in the counts
	keepSlowlog(b, rdb)
	must := func(err error) {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
	}

	// The script each SHA names.
	scripts := map[string]string{}
	for _, n := range lua.Names() {
		scripts[lua.Script(n).Hash()] = n
	}
	del := redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)
	scripts[del.Hash()] = "floor_del"
	for _, s := range []struct {
		name string
		s    *redis.Script
	}{{"noop_lock", noopLock}, {"noop_unlock", noopUnlock}, {"bare_lock", bareLock}, {"bare_unlock", bareUnlock},
		{"bare_noids_lock", bareNoIDsLock}, {"bare_noids_unlock", bareNoIDsUnlock}} {
		scripts[s.s.Hash()] = s.name
	}

	type variant struct {
		prefix string
		swap   func() (restore func())
	}
	variants := []variant{{"", func() func() { return func() {} }}}
	same := map[string]bool{} // SHAs of scripts the base has unchanged
	if dir := os.Getenv("DSYNC_SERVER_TIME_BASE"); dir != "" {
		srcs := map[string]string{}
		for _, n := range []string{"mutex_lock", "mutex_unlock", "rwmutex_lock", "rwmutex_unlock", "semaphore_acquire", "semaphore_release", "once_do", "once_release"} {
			// Put together as lua.Source does (lib.lua's definitions that
			// the script uses, then the script): a base with every
			// definition would pay for the unused ones on every call.
			src := luasrc.Join(readLua(b, dir, "lib"), readLua(b, dir, n[:strings.Index(n, "_")]+"_lib")+readLua(b, dir, n))
			srcs[n] = src
			if h := redis.NewScript(src).Hash(); scripts[h] == n {
				same[h] = true // unchanged: its calls are named by variant
			} else {
				scripts[h] = "base:" + n
			}
		}
		variants = append(variants, variant{"base:", func() func() {
			var restore []func()
			for n, src := range srcs {
				restore = append(restore, dsync.SwapScript(n, src))
			}
			return func() {
				for _, r := range restore {
					r()
				}
			}
		}})
	}

	base := redistest.Key(b)
	m, rw, sem := c.Mutex(base+":m"), c.RWMutex(base+":rw"), c.Semaphore(base+":s", 4)
	floorKey := base + ":floor"
	onceN := 0
	// The operations, each run alone; mode tells apart the modes of one
	// script (an RWMutex's read and write holds).
	ops := []struct {
		name, mode string
		pair       func()
	}{
		{"floor", "", func() {
			ok, err := rdb.SetNX(ctx, floorKey, "token", 30e9).Result()
			must(err)
			if !ok {
				b.Fatal("floor: SET NX refused")
			}
			must(del.Run(ctx, rdb, []string{floorKey}, "token").Err())
		}},
		{"mutex", "", func() { must(m.Lock(ctx)); must(m.Unlock(ctx)) }},
		{"noop", "", func() { must(mutexShaped(ctx, rdb, base+":noop", noopLock, noopUnlock)) }},
		{"bare", "", func() { must(mutexShaped(ctx, rdb, base+":bare", bareLock, bareUnlock)) }},
		{"bare_noids", "", func() { must(mutexShaped(ctx, rdb, base+":bare_noids", bareNoIDsLock, bareNoIDsUnlock)) }},
		{"rwmutex(w)", "(w)", func() { must(rw.Lock(ctx)); must(rw.Unlock(ctx)) }},
		{"rwmutex(r)", "(r)", func() { must(rw.RLock(ctx)); must(rw.RUnlock(ctx)) }},
		{"semaphore", "", func() { must(sem.Acquire(ctx, 1)); must(sem.Release(ctx, 1)) }},
		{"once", "", func() {
			onceN++
			must(c.Once(fmt.Sprintf("%s:o%d", base, onceN)).Do(ctx, func(context.Context) error { return nil }))
		}},
	}
	for _, v := range variants {
		restore := v.swap()
		for _, op := range ops {
			op.pair() // warm up: connections, script cache
		}
		restore()
	}

	perRound := map[string][]float64{} // metric -> its figure in each round
	for r := 0; r < rounds; r++ {
		for _, op := range ops {
			for i := range variants {
				// Every other round the other variant goes first.
				v := variants[(i+r)%len(variants)]
				restore := v.swap()
				// Per script, by SLOWLOG.
				must(rdb.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err())
				must(rdb.SlowLogReset(ctx).Err())
				for i := 0; i < calls; i++ {
					op.pair()
				}
				must(rdb.ConfigSet(ctx, "slowlog-log-slower-than", "-1").Err())
				log, err := rdb.SlowLogGet(ctx, 16384).Result()
				must(err)
				durs := map[string][]float64{}
				for _, e := range log {
					var name string
					switch {
					case len(e.Args) >= 2 && strings.EqualFold(e.Args[0], "evalsha"):
						name = scripts[e.Args[1]]
						if name == "floor_del" || strings.HasPrefix(name, "noop_") || strings.HasPrefix(name, "bare_") || same[e.Args[1]] {
							name = v.prefix + name
						}
					case len(e.Args) >= 2 && strings.EqualFold(e.Args[0], "set") && e.Args[1] == floorKey:
						name = v.prefix + "floor_set"
					}
					if name != "" {
						name += op.mode + "-µs"
						durs[name] = append(durs[name], float64(e.Duration.Nanoseconds())/1e3)
					}
				}
				for name, d := range durs {
					perRound[name] = append(perRound[name], midMean(d))
				}

				// Per pair, by INFO commandstats.
				must(rdb.ConfigResetStat(ctx).Err())
				for i := 0; i < calls; i++ {
					op.pair()
				}
				info, err := rdb.Info(ctx, "commandstats").Result()
				must(err)
				perRound[v.prefix+op.name+"-µs/pair"] = append(perRound[v.prefix+op.name+"-µs/pair"],
					(usec(info, "evalsha")+usec(info, "set"))/calls)
				restore()
			}
		}
	}
	names := slices.Sorted(maps.Keys(perRound))
	for _, n := range names {
		b.ReportMetric(median(perRound[n]), n)
	}
	// Against the base: the median of the rounds' ratios, each taken
	// between calls that ran next to each other.
	for _, n := range names {
		base, ok := perRound["base:"+n]
		if !ok || len(base) != len(perRound[n]) {
			continue
		}
		ratios := make([]float64, len(base))
		for r := range base {
			ratios[r] = perRound[n][r] / base[r]
		}
		b.ReportMetric(median(ratios), n+"-×base")
	}
}

// usec returns the total µs INFO commandstats reports for cmd.
func usec(info, cmd string) float64 {
	for _, l := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(l), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, _ := strconv.ParseFloat(v, 64)
				return n
			}
		}
	}
	return 0
}

// readLua returns the file name.lua of dir, or "" when there is none.
func readLua(b *testing.B, dir, name string) string {
	src, err := os.ReadFile(filepath.Join(dir, name+".lua"))
	if errors.Is(err, fs.ErrNotExist) {
		return ""
	} else if err != nil {
		b.Fatal(err)
	}
	return string(src)
}

// midMean returns the mean of the middle half of xs; it sorts xs.
func midMean(xs []float64) float64 {
	slices.Sort(xs)
	mid := xs[len(xs)/4 : len(xs)-len(xs)/4]
	sum := 0.0
	for _, x := range mid {
		sum += x
	}
	return sum / float64(len(mid))
}

// median returns the median of xs (the mean of the middle two when their
// number is even); it sorts xs.
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// Scripts for the parts of a Mutex pair's server time (see
// BenchmarkServerTime): noop returns at once; bare makes the redis.calls
// of an uncontended Mutex Lock and Unlock (as MONITOR shows them: the
// lock reads the hold, looks its call id up, reads the queue's head and
// the fence, writes the fence, notes its id and writes the hold; the
// unlock reads the hold, deletes it and notes its id) and nothing else;
// bare_noids the same but for the calls on the call ids' key (KEYS[5]).
var (
	noopLock    = redis.NewScript(`return {1, 1}`)
	noopUnlock  = redis.NewScript(`return 1`)
	bareLockSrc = `
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
redis.call('HMGET', KEYS[1], ARGV[1], ':c', ':f', ':w')
redis.call('ZMSCORE', KEYS[5], ARGV[3], ':p')
redis.call('ZRANGE', KEYS[3], '0', '0')
local fence = redis.call('HMGET', KEYS[2], 'n', 'e')
local f = string.format('%d', math.max((tonumber(fence[1]) or 0) + 1, now_us))
redis.call('HSET', KEYS[2], 'n', f)
redis.call('ZADD', KEYS[5], string.format('%d', (now_ms + 60000) * 4 + 1), ARGV[3])
redis.call('PEXPIRE', KEYS[5], '60000')
redis.call('HSET', KEYS[1], ARGV[1], '1', ':f', f, ':c', ARGV[3], ':p', string.format('%d', (now_ms + 5000) * 4))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, tonumber(f)}`
	bareUnlockSrc = `
redis.call('HMGET', KEYS[1], ARGV[1], ':c', ':w', ':f', ':d', ':p', ':k')
local t = redis.call('TIME')
local now_ms = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
redis.call('DEL', KEYS[1])
redis.call('ZADD', KEYS[5], string.format('%d', (now_ms + 60000) * 4 + 1), ARGV[2])
redis.call('PEXPIRE', KEYS[5], '60000')
return 1`
)

var (
	bareLock, bareUnlock           = redis.NewScript(bareLockSrc), redis.NewScript(bareUnlockSrc)
	bareNoIDsLock, bareNoIDsUnlock = redis.NewScript(withoutKey(bareLockSrc, "KEYS[5]")), redis.NewScript(withoutKey(bareUnlockSrc, "KEYS[5]"))
)

// withoutKey returns the script src without its lines that name key.
func withoutKey(src, key string) string {
	var keep []string
	for _, l := range strings.Split(src, "\n") {
		if !strings.Contains(l, key) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// keepSlowlog makes the server's SLOWLOG hold 16384 entries, and restores
// its settings (the length and the threshold, which the caller may change)
// at the end of b.
func keepSlowlog(b *testing.B, rdb redis.UniversalClient) {
	b.Helper()
	ctx := context.Background()
	for _, p := range []string{"slowlog-log-slower-than", "slowlog-max-len"} {
		old, err := rdb.ConfigGet(ctx, p).Result()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = rdb.ConfigSet(context.Background(), p, old[p]).Err() })
	}
	if err := rdb.ConfigSet(ctx, "slowlog-max-len", "16384").Err(); err != nil {
		b.Fatal(err)
	}
}

// shapedCalls numbers the calls of mutexShaped.
var shapedCalls int

// mutexShaped runs lock and then unlock with the KEYS and ARGV an
// uncontended Mutex Lock and Unlock of a name under prefix send: the
// five keys, a holder token, TTL, call id, wait flag, fence idle time,
// reentrancy flag, secret and bound; then the token, call id, channel,
// idle time, two empty fields and the hold's fencing token.
func mutexShaped(ctx context.Context, rdb redis.UniversalClient, prefix string, lock, unlock *redis.Script) error {
	h := "{" + prefix + "}"
	keys := []string{h, h + ":f", h + ":q", h + ":qd", h + ":x"}
	tok := "bench/1/00000000-0000-4000-8000-000000000000"
	shapedCalls++
	id := fmt.Sprintf("l%012d", shapedCalls)
	bound := strconv.FormatInt(time.Now().Add(20*time.Second).UnixMilli(), 10)
	r, err := lock.Run(ctx, rdb, keys, tok, "30000", id, "1", "86400000", "0", "0123456789abcdef0123456789abcdef", bound).Slice()
	if err != nil {
		return err
	}
	if len(r) != 2 {
		return fmt.Errorf("lock replied %v", r)
	}
	return unlock.Run(ctx, rdb, keys, tok, fmt.Sprintf("u%012d", shapedCalls), h, "86400000", "", "", fmt.Sprint(r[1])).Err()
}
