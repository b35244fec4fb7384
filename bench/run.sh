#!/usr/bin/env bash
# Runs dsync's benchmarks and the peer comparison (bench/peers) on one
# redis-server started here, and prints the results as markdown: the
# machine, the tables with ratios taken within this run, and the targets.
#
#   bench/run.sh                 # from the repository root
#   CLUSTER=1 bench/run.sh       # the same on a 3-master Redis Cluster too
#
# With CLUSTER=1 it also starts a local Redis Cluster of three masters
# (free loopback ports, pinned like the single server, stopped by PID on
# exit) and runs every benchmark on both, interleaved round by round; it
# then prints the cluster's tables and the cluster's figures as ratios to
# the single server's of the same run. The benchmarks reach the cluster
# through go-redis's cluster client ($DSYNC_BENCH_CLUSTER_ADDRS) and count
# round trips per node. The server time per script is measured on the
# single server only (a node runs a script as a single server does).
#
# Environment: COUNT (rounds of the uncontended benchmarks, each library
# once a round, median taken; default 3), BENCHTIME (per run; default 2s), DSYNC_BENCH_WINDOW (measuring
# window of each contended benchmark; default 2s), ONCE_ROUNDS (rounds of
# the contended Once benchmark; default 300), PIN=0 to not pin the
# server and the benchmarks to separate cores, CLUSTER=1 (above). Progress
# goes to stderr.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
count=${COUNT:-3}
benchtime=${BENCHTIME:-2s}
export DSYNC_BENCH_WINDOW=${DSYNC_BENCH_WINDOW:-2s}
once_rounds=${ONCE_ROUNDS:-300}
targets=(single)
[ "${CLUSTER:-0}" = 1 ] && targets+=(cluster)

for bin in go redis-server redis-cli; do
	command -v "$bin" >/dev/null || { echo "run.sh: $bin not on PATH" >&2; exit 1; }
done

. "$here/server.sh"
make_work
pin_cores

# Build first, unpinned.
echo "run.sh: building" >&2
(cd "$repo" && go test -c -o "$work/dsync.test" .)
(cd "$here/peers" && go test -c -o "$work/peers.test" . && go build -o "$work/benchtable" ./cmd/benchtable)

start_server "$work"
export DSYNC_BENCH_REDIS_ADDR=127.0.0.1:$port
echo "run.sh: redis-server pid $pid on $DSYNC_BENCH_REDIS_ADDR" >&2
if [ "${#targets[@]}" -gt 1 ]; then
	start_cluster "$work/cluster"
	echo "run.sh: redis cluster pids ${cluster_pids[*]} on $cluster_addrs" >&2
fi

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
# run runs benchmarks on the single server (target single) or the cluster
# (target cluster); a cluster's output goes to cluster-OUTPUT.
run() { # target dir binary output args...
	local target=$1 dir=$2 bin=$3 out=$4 env=()
	shift 4
	if [ "$target" = cluster ]; then
		env=("DSYNC_BENCH_CLUSTER_ADDRS=$cluster_addrs")
		out=$(dirname "$out")/cluster-$(basename "$out")
	fi
	(cd "$dir" && env ${env[@]+"${env[@]}"} ${client_pin[@]+"${client_pin[@]}"} "$bin" -test.run '^$' "$@") | tee -a "$out" >&2
}

# Each round runs every library once (on each target), so that a slow
# spell on the machine hits all of them alike; the table takes the median
# over the rounds.
for round in $(seq 1 "$count"); do
	for target in "${targets[@]}"; do
		echo "run.sh: round $round of $count, $target: dsync primitives" >&2
		run "$target" "$repo" "$work/dsync.test" "$work/root.txt" -test.benchmem -test.benchtime "$benchtime" \
			-test.bench '^(BenchmarkRawFloor|BenchmarkMutexScriptFloor|BenchmarkMutex|BenchmarkMutexFixed|BenchmarkRWMutexRead|BenchmarkRWMutexWrite|BenchmarkOnceDone)$'
		run "$target" "$repo" "$work/dsync.test" "$work/root.txt" -test.benchmem -test.benchtime "$benchtime" \
			-test.bench '^(BenchmarkMutexReentry|BenchmarkRWMutexReentry|BenchmarkSemaphore|BenchmarkDistinct)$/^(mode=.*|op=uncontended|lib=.*)$'
		echo "run.sh: round $round of $count, $target: peers, uncontended and distinct names" >&2
		run "$target" "$here/peers" "$work/peers.test" "$work/peers.txt" -test.benchmem -test.benchtime "$benchtime" \
			-test.bench '^(BenchmarkUncontended|BenchmarkDistinct)$'
	done
done
for target in "${targets[@]}"; do
	echo "run.sh: $target: peers, contended" >&2
	run "$target" "$here/peers" "$work/peers.test" "$work/peers.txt" -test.benchtime 1x -test.bench '^BenchmarkContended$'
	echo "run.sh: $target: dsync primitives, contended" >&2
	run "$target" "$repo" "$work/dsync.test" "$work/root.txt" -test.benchtime 1x \
		-test.bench '^BenchmarkContended$/^lib=dsync-(rwmutex|semaphore)$'
	run "$target" "$repo" "$work/dsync.test" "$work/root.txt" -test.benchtime "${once_rounds}x" -test.bench '^BenchmarkOnceContended$'
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

commandstats=$(redis-cli -p "$port" info commandstats | tr -d '\r' | grep -E 'cmdstat_(evalsha|eval|set|publish|subscribe)' || true)

# Server time per script (it resets the server's statistics: after the
# whole-run commandstats above).
echo "run.sh: server time per script" >&2
run single "$repo" "$work/dsync.test" "$work/servertime.txt" -test.benchtime 1x -test.bench '^BenchmarkServerTime$'

model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
pinning="not pinned"
if [ ${#server_pin[@]} -gt 0 ]; then
	pinning="redis-server on CPU 0, benchmarks on CPU 1"
	[ "$ncpu" -gt 2 ] && pinning="redis-server on CPU 0, benchmarks on CPUs 1-$((ncpu - 1))"
	[ "${#targets[@]}" -gt 1 ] && pinning="${pinning/redis-server/redis-server and the 3 cluster nodes}"
fi
cat <<EOT
## Results

- CPU: $model, $ncpu cores; $pinning
- $(redis-server --version | cut -d' ' -f1-3) (\`--save '' --appendonly no\`, loopback), $(go version | cut -d' ' -f3-4), go-redis $(cd "$repo" && go list -m -f '{{.Version}}' github.com/redis/go-redis/v9)
- peers: $(cd "$here/peers" && go list -m -f '{{.Path}} {{.Version}}' github.com/go-redsync/redsync/v4 github.com/bsm/redislock | paste -sd ',' | sed 's/,/, /')
- load average (1, 5, 15 min): $load_start at start, $load_end at end
- $count rounds of ${benchtime} per uncontended benchmark, libraries interleaved (median); one ${DSYNC_BENCH_WINDOW} window per contended benchmark; ${once_rounds} rounds per contended Once

EOT
"$work/benchtable" "$work/root.txt" "$work/peers.txt"
cat <<EOT

### Server time per script

Each hot script called alone in a loop (BenchmarkServerTime: SLOWLOG per
call, median over interleaved rounds), next to the raw floor's SET NX PX and
compare-and-delete; a pair is the server's time for the scripts of one
Lock+Unlock (INFO commandstats). Two rows split the Mutex pair: noop, two
scripts that return at once called with the Mutex's KEYS and ARGV (what
calling any script with them costs), and bare, two scripts that make the
pair's redis.calls with none of its checks (what its commands cost), and
bare_noids, the same less the calls on the call ids' key (bare less
bare_noids: what the call-id records cost); the rest of the mutex pair is
the scripts' own Lua.

| script or pair | server µs |
|---|--:|
$(grep '^BenchmarkServerTime' "$work/servertime.txt" | tr '\t' '\n' | grep 'µs' | awk '{u=$2; sub(/-µs(\/pair)?$/, "", u); if ($2 ~ /pair$/) u=u " (pair)"; printf "| %s | %.1f |\n", u, $1}')

<details><summary>Server-side cost per command (INFO commandstats, whole run)</summary>

\`\`\`
$commandstats
\`\`\`
</details>
EOT
if [ "${#targets[@]}" -gt 1 ]; then
	cat <<EOT

## On a 3-master cluster

The same benchmarks in the same run, on a Redis Cluster of three masters
without replicas (go-redis cluster client, \`ClusterStateReloadInterval\`
1 s; round trips counted per node, so a pipeline over three masters is
three); then the cluster's figures as ratios to the single server's.

EOT
	"$work/benchtable" "$work/cluster-root.txt" "$work/cluster-peers.txt" "$work/root.txt" "$work/peers.txt"
fi
