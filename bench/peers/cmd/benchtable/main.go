// Command benchtable reads the output of bench/run.sh's benchmark runs and
// prints the markdown tables of docs/performance.md, with every ratio taken
// within the run: uncontended and distinct-name pairs against the raw floor,
// contended hand-off against the best peer variant, and dsync's primitives
// (RWMutex, Semaphore, Once) uncontended and contended.
//
// Usage: benchtable ROOT_OUTPUT PEERS_OUTPUT [SINGLE_ROOT_OUTPUT SINGLE_PEERS_OUTPUT]
//
// With four arguments the first two are a cluster's outputs and the last
// two the single server's of the same run (CLUSTER=1 bench/run.sh): it
// prints the cluster's tables, and in place of the targets (which are set
// for the single server) the cluster's throughput as ratios to the single
// server's.
package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// results maps a benchmark name (without the -GOMAXPROCS suffix) to its
// metrics by unit, one value per -count run.
type results map[string]map[string][]float64

var procSuffix = regexp.MustCompile(`-\d+$`)

func parse(r io.Reader, res results) error {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := procSuffix.ReplaceAllString(f[0], "")
		if res[name] == nil {
			res[name] = map[string][]float64{}
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			res[name][f[i+1]] = append(res[name][f[i+1]], v)
		}
	}
	return sc.Err()
}

// get returns the median of a metric, NaN when absent.
func (res results) get(name, unit string) float64 {
	vs := res[name][unit]
	if len(vs) == 0 {
		return math.NaN()
	}
	vs = slices.Clone(vs)
	slices.Sort(vs)
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}

func (res results) runs(name string) int { return len(res[name]["ns/op"]) }

func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case math.Abs(v) >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

func ratio(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return "–"
	}
	return strconv.FormatFloat(a/b, 'f', 2, 64) + "×"
}

type target struct {
	what, got string
	ok        bool
}

func main() {
	if len(os.Args) != 3 && len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: benchtable ROOT_OUTPUT PEERS_OUTPUT [SINGLE_ROOT_OUTPUT SINGLE_PEERS_OUTPUT]")
		os.Exit(2)
	}
	var outputs []results
	for _, path := range os.Args[1:] {
		res := results{}
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		err = parse(f, res)
		f.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		outputs = append(outputs, res)
	}
	targets := tables(outputs[0], outputs[1])
	if len(outputs) == 4 {
		scaling(outputs[0], outputs[1], outputs[2], outputs[3])
		return
	}
	fmt.Println("### Targets (dsync, ratios within this run)")
	fmt.Println()
	fmt.Println("| target | got | met |")
	fmt.Println("|---|--:|:-:|")
	for _, t := range targets {
		mark := "no"
		if t.ok {
			mark = "yes"
		}
		fmt.Printf("| %s | %s | %s |\n", t.what, t.got, mark)
	}
}

// The libraries of the peer comparison, uncontended and contended.
var (
	libs  = []string{"raw", "dsync", "redsync", "redislock"}
	clibs = []string{"dsync", "redsync", "redsync-1ms", "redislock", "redislock-1ms"}
)

// uncontendedRows are the rows of the table of dsync's primitives,
// uncontended: label and benchmark name in the root package's output.
var uncontendedRows = []struct{ label, name string }{
	{"raw floor: SET NX PX + compare-and-delete", "BenchmarkRawFloor"},
	{"floor of one script a call: the EVALSHAs of a Mutex pair, scripts that return at once", "BenchmarkMutexScriptFloor"},
	{"Mutex Lock+Unlock", "BenchmarkMutex"},
	{"Mutex Lock+Unlock, FixedLease", "BenchmarkMutexFixed"},
	{"Mutex re-entry, script reentrancy", "BenchmarkMutexReentry/mode=script"},
	{"Mutex re-entry, client reentrancy", "BenchmarkMutexReentry/mode=client"},
	{"RWMutex RLock+RUnlock", "BenchmarkRWMutexRead"},
	{"RWMutex Lock+Unlock", "BenchmarkRWMutexWrite"},
	{"RWMutex read re-entry, script reentrancy", "BenchmarkRWMutexReentry/mode=script/lock=read"},
	{"RWMutex read re-entry, client reentrancy", "BenchmarkRWMutexReentry/mode=client/lock=read"},
	{"RWMutex write re-entry, script reentrancy", "BenchmarkRWMutexReentry/mode=script/lock=write"},
	{"RWMutex write re-entry, client reentrancy", "BenchmarkRWMutexReentry/mode=client/lock=write"},
	{"Semaphore Acquire+Release", "BenchmarkSemaphore/op=uncontended"},
	{"Once.Do, done", "BenchmarkOnceDone"},
	{"1000 names × 16 goroutines: raw", "BenchmarkDistinct/lib=raw"},
	{"1000 names × 16 goroutines: dsync", "BenchmarkDistinct/lib=dsync"},
	{"1000 names × 16 goroutines: dsync, calls not coalesced", "BenchmarkDistinct/lib=dsync-alone"},
}

// tables prints the tables of one target (a single server or a cluster)
// and returns the targets checked on them.
func tables(root, peers results) []target {
	var targets []target
	check := func(what string, v, limit float64, atLeast bool) {
		ok := !math.IsNaN(v) && ((atLeast && v >= limit) || (!atLeast && v <= limit))
		targets = append(targets, target{what, num(v), ok})
	}

	// Uncontended and distinct names, from bench/peers.
	u := func(lib, unit string) float64 { return peers.get("BenchmarkUncontended/lib="+lib, unit) }
	d := func(lib, unit string) float64 { return peers.get("BenchmarkDistinct/lib="+lib, unit) }
	fmt.Println("### Uncontended Lock+Unlock, and 1000 distinct names from 16 goroutines")
	fmt.Println()
	fmt.Println("| library | pairs/s | × raw | µs/pair | allocs/pair | × raw | round trips/pair | distinct: pairs/s | × raw | allocs/pair |")
	fmt.Println("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, lib := range libs {
		fmt.Printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", lib,
			num(u(lib, "pairs/s")), ratio(u(lib, "pairs/s"), u("raw", "pairs/s")),
			num(u(lib, "ns/op")/1e3),
			num(u(lib, "allocs/op")), ratio(u(lib, "allocs/op"), u("raw", "allocs/op")),
			num(u(lib, "roundtrips/op")),
			num(d(lib, "pairs/s")), ratio(d(lib, "pairs/s"), d("raw", "pairs/s")),
			num(d(lib, "allocs/op")))
	}
	fmt.Println()
	bestU := math.NaN()
	for _, lib := range libs[2:] {
		if v := u(lib, "pairs/s"); !math.IsNaN(v) && (math.IsNaN(bestU) || v > bestU) {
			bestU = v
		}
	}
	check("uncontended pairs/s ≥ 0.95× raw", u("dsync", "pairs/s")/u("raw", "pairs/s"), 0.95, true)
	check(fmt.Sprintf("uncontended pairs/s ≥ 0.97× best peer (%s pairs/s)", num(bestU)), u("dsync", "pairs/s")/bestU, 0.97, true)
	check("uncontended allocs ≤ 1.5× raw", u("dsync", "allocs/op")/u("raw", "allocs/op"), 1.5, false)
	check("distinct names pairs/s ≥ 1.2× raw", d("dsync", "pairs/s")/d("raw", "pairs/s"), 1.2, true)

	// Contended, from bench/peers.
	c := func(lib string, g int, unit string) float64 {
		return peers.get(fmt.Sprintf("BenchmarkContended/lib=%s/G=%d", lib, g), unit)
	}
	fmt.Println("### Contended: one lock, G goroutines over 4 clients, unlock at once")
	fmt.Println()
	fmt.Println("| library | G | acq/s | × best peer | wait p50 ms | wait p99 ms | wait max ms | handoff µs | fairness | retake % | violations | failed Locks | allocs/acq | round trips/acq |")
	fmt.Println("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, g := range []int{8, 32} {
		bestAcq, bestMax := math.NaN(), math.NaN()
		for _, lib := range clibs[1:] {
			if v := c(lib, g, "acq/s"); !math.IsNaN(v) && (math.IsNaN(bestAcq) || v > bestAcq) {
				bestAcq = v
			}
			if v := c(lib, g, "wait-max-ms"); !math.IsNaN(v) && (math.IsNaN(bestMax) || v < bestMax) {
				bestMax = v
			}
		}
		for _, lib := range clibs {
			fmt.Printf("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", lib, g,
				num(c(lib, g, "acq/s")), ratio(c(lib, g, "acq/s"), bestAcq),
				num(c(lib, g, "wait-p50-ms")), num(c(lib, g, "wait-p99-ms")), num(c(lib, g, "wait-max-ms")),
				num(c(lib, g, "handoff-us")), num(c(lib, g, "fairness")), num(c(lib, g, "retake-%")),
				num(c(lib, g, "violations")), num(c(lib, g, "lock-errors")),
				num(c(lib, g, "allocs/acq")), num(c(lib, g, "roundtrips/acq")))
		}
		check(fmt.Sprintf("G=%d throughput ≥ 1.0× best peer (%s acq/s)", g, num(bestAcq)), c("dsync", g, "acq/s")/bestAcq, 1.0, true)
		check(fmt.Sprintf("G=%d worst wait ≤ 0.25× best peer's (%s ms)", g, num(bestMax)), c("dsync", g, "wait-max-ms")/bestMax, 0.25, false)
		check(fmt.Sprintf("G=%d fairness ≥ 0.9", g), c("dsync", g, "fairness"), 0.9, true)
		check(fmt.Sprintf("G=%d allocations per acquisition ≤ 40", g), c("dsync", g, "allocs/acq"), 40, false)
		check(fmt.Sprintf("G=%d violations = 0", g), c("dsync", g, "violations"), 0, false)
	}
	fmt.Println()

	// dsync's primitives, from the root package.
	rawNs := root.get("BenchmarkRawFloor", "ns/op")
	fmt.Println("### dsync primitives, uncontended (root package)")
	fmt.Println()
	fmt.Println("| benchmark | µs/op | ops/s | × raw floor | round trips/op | allocs/op | B/op |")
	fmt.Println("|---|--:|--:|--:|--:|--:|--:|")
	for _, row := range uncontendedRows {
		if root.runs(row.name) == 0 {
			continue
		}
		ns := root.get(row.name, "ns/op")
		raw := rawNs
		if strings.HasPrefix(row.name, "BenchmarkDistinct/") {
			raw = root.get("BenchmarkDistinct/lib=raw", "ns/op")
		}
		fmt.Printf("| %s | %s | %s | %s | %s | %s | %s |\n", row.label, num(ns/1e3), num(1e9/ns),
			ratio(raw, ns), num(root.get(row.name, "roundtrips/op")),
			num(root.get(row.name, "allocs/op")), num(root.get(row.name, "B/op")))
	}
	fmt.Println()

	// dsync's primitives contended, from the root package; the Mutex rows
	// are the peers run's.
	fmt.Println("### dsync primitives, contended: G goroutines over 4 clients")
	fmt.Println()
	fmt.Println("| primitive | G | acq/s (Once: Do/s) | wait p50 ms | wait p99 ms | wait max ms | fairness | violations | allocs/acq | round trips/acq |")
	fmt.Println("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, g := range []int{8, 32} {
		for _, row := range []struct {
			label, name string
			res         results
		}{
			{"Mutex (peers run)", "BenchmarkContended/lib=dsync", peers},
			{"RWMutex, write lock", "BenchmarkContended/lib=dsync-rwmutex", root},
			{"Semaphore, size 1", "BenchmarkContended/lib=dsync-semaphore", root},
		} {
			name := fmt.Sprintf("%s/G=%d", row.name, g)
			if row.res.runs(name) == 0 {
				continue
			}
			get := func(unit string) string { return num(row.res.get(name, unit)) }
			fmt.Printf("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", row.label, g,
				get("acq/s"), get("wait-p50-ms"), get("wait-p99-ms"), get("wait-max-ms"),
				get("fairness"), get("violations"), get("allocs/acq"), get("roundtrips/acq"))
		}
		if name := fmt.Sprintf("BenchmarkOnceContended/G=%d", g); root.runs(name) > 0 {
			get := func(unit string) string { return num(root.get(name, unit)) }
			fmt.Printf("| Once.Do, all at once on a fresh name | %d | %s | %s | %s | %s | – | 0 | %s | %s |\n", g,
				get("Do/s"), get("round-p50-ms"), get("round-p99-ms"), get("round-max-ms"),
				get("allocs/Do"), get("roundtrips/Do"))
		}
	}
	fmt.Println()
	fmt.Println("Once rows: per round, G calls of Do on one fresh name at once (f sleeps 1 ms);")
	fmt.Println("wait is the time from the start of a round until every Do returned, allocations and")
	fmt.Println("round trips are per Do. A round in which f did not run exactly once fails the")
	fmt.Println("benchmark, so a row here means no violation.")
	fmt.Println()
	mutex := root.get("BenchmarkMutex", "ns/op")
	for _, p := range []struct{ label, name string }{
		{"RWMutex RLock+RUnlock", "BenchmarkRWMutexRead"},
		{"RWMutex Lock+Unlock", "BenchmarkRWMutexWrite"},
		{"Semaphore Acquire+Release", "BenchmarkSemaphore/op=uncontended"},
	} {
		// Pairs per second against the Mutex's: its time per pair over theirs.
		check(p.label+" pairs/s ≥ 0.9× the Mutex's", mutex/root.get(p.name, "ns/op"), 0.9, true)
	}
	script := root.get("BenchmarkMutexReentry/mode=script", "ns/op")
	client := root.get("BenchmarkMutexReentry/mode=client", "ns/op")
	check("client re-entry ≥ 100× faster than script re-entry", script/client, 100, true)
	return targets
}

// scaling prints the cluster's throughput (and dsync's worst contended
// wait) and its ratio to the single server's.
func scaling(root, peers, singleRoot, singlePeers results) {
	fmt.Println("### The cluster against the single server (ratios within this run)")
	fmt.Println()
	fmt.Println("| benchmark | metric | cluster | × single server |")
	fmt.Println("|---|---|--:|--:|")
	// row prints one metric; ops/s is 1e9 / ns/op.
	row := func(label, name, unit string, cluster, single results) {
		get := func(res results) float64 {
			if unit == "ops/s" {
				return 1e9 / res.get(name, "ns/op")
			}
			return res.get(name, unit)
		}
		a, b := get(cluster), get(single)
		if math.IsNaN(a) && math.IsNaN(b) {
			return
		}
		fmt.Printf("| %s | %s | %s | %s |\n", label, unit, num(a), ratio(a, b))
	}
	for _, lib := range libs {
		row("uncontended Lock+Unlock: "+lib, "BenchmarkUncontended/lib="+lib, "pairs/s", peers, singlePeers)
	}
	for _, lib := range libs {
		row("1000 names × 16 goroutines: "+lib, "BenchmarkDistinct/lib="+lib, "pairs/s", peers, singlePeers)
	}
	row("1000 names × 16 goroutines: dsync, calls not coalesced", "BenchmarkDistinct/lib=dsync-alone", "pairs/s", root, singleRoot)
	for _, g := range []int{8, 32} {
		for _, lib := range clibs {
			row(fmt.Sprintf("contended, G=%d: %s", g, lib), fmt.Sprintf("BenchmarkContended/lib=%s/G=%d", lib, g), "acq/s", peers, singlePeers)
		}
		row(fmt.Sprintf("contended, G=%d: dsync", g), fmt.Sprintf("BenchmarkContended/lib=dsync/G=%d", g), "wait-max-ms", peers, singlePeers)
	}
	for _, r := range uncontendedRows {
		// Distinct names are above; a client re-entry sends nothing.
		if !strings.HasPrefix(r.name, "BenchmarkDistinct/") && !strings.HasSuffix(r.label, "client reentrancy") {
			row("dsync primitives: "+r.label, r.name, "ops/s", root, singleRoot)
		}
	}
	for _, g := range []int{8, 32} {
		for _, lib := range []string{"dsync-rwmutex", "dsync-semaphore"} {
			row(fmt.Sprintf("contended, G=%d: %s", g, lib), fmt.Sprintf("BenchmarkContended/lib=%s/G=%d", lib, g), "acq/s", root, singleRoot)
		}
		row(fmt.Sprintf("Once.Do, all at once, G=%d", g), fmt.Sprintf("BenchmarkOnceContended/G=%d", g), "Do/s", root, singleRoot)
	}
	fmt.Println()
}
