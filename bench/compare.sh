#!/usr/bin/env bash
# Compares the uncontended benchmarks of this checkout with those of another
# revision, on one redis-server started here, rounds interleaved (old, new,
# old, new, ...) so that a slow spell on the machine hits both alike; prints
# the median of each benchmark and the ratio new/old.
#
#   bench/compare.sh REV            # from the repository root
#
# Environment: COUNT (rounds; default 5), BENCHTIME (per run; default 1s),
# BENCH (benchmark regexp; default the uncontended pairs and the floor).
set -euo pipefail

rev=${1:?usage: bench/compare.sh REV}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
count=${COUNT:-5}
benchtime=${BENCHTIME:-1s}
bench=${BENCH:-'^(BenchmarkRawFloor|BenchmarkMutex|BenchmarkRWMutexRead|BenchmarkRWMutexWrite|BenchmarkSemaphore)$'}

. "$here/server.sh"
cleanup_more() { git -C "$repo" worktree remove --force "$work/old" >/dev/null 2>&1 || true; }
make_work
pin_cores

echo "compare.sh: building $rev and the working tree" >&2
git -C "$repo" worktree add -q --detach "$work/old" "$rev"
(cd "$work/old" && go test -c -o "$work/old.test" .)
(cd "$repo" && go test -c -o "$work/new.test" .)

start_server "$work"
export DSYNC_BENCH_REDIS_ADDR=127.0.0.1:$port

for round in $(seq 1 "$count"); do
	echo "compare.sh: round $round of $count" >&2
	for side in old new; do
		redis-cli -p "$port" config resetstat >/dev/null
		(cd "$repo" && "${client_pin[@]}" "$work/$side.test" -test.run '^$' -test.benchmem \
			-test.benchtime "$benchtime" -test.bench "$bench") | grep '^Benchmark' | sed "s/^/$side /" >>"$work/out.txt"
		# Server time of the scripts: total µs and calls of EVALSHA.
		redis-cli -p "$port" info commandstats | tr -d '\r' | grep '^cmdstat_evalsha:' |
			sed -E "s/.*calls=([0-9]+),usec=([0-9]+),.*/$side \1 \2/" >>"$work/server.txt"
	done
done

# Median ns/op and allocs/op per benchmark and side, and new/old.
echo "| benchmark | $rev µs/op | new µs/op | new/old | $rev allocs | new allocs |"
echo "|---|--:|--:|--:|--:|--:|"
awk '
function median(list,   n, a, i, j, t) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
{
	side = $1; name = $2; sub(/-[0-9]+$/, "", name)
	for (i = 3; i <= NF; i++) {
		if ($(i+1) == "ns/op") ns[side, name] = ns[side, name] " " $i
		if ($(i+1) == "allocs/op") al[side, name] = al[side, name] " " $i
	}
	names[name] = 1
}
END {
	for (n in names) {
		o = median(ns["old", n]); w = median(ns["new", n])
		printf "| %s | %.1f | %.1f | %.2f | %s | %s |\n", n, o / 1000, w / 1000, (o > 0 ? w / o : 0), median(al["old", n]), median(al["new", n])
	}
}' "$work/out.txt" | sort
awk '{ c[$1] += $2; u[$1] += $3 } END {
	printf "\nServer time per script call (EVALSHA, all benchmarks above): %s %.1f µs, new %.1f µs (new/old %.2f)\n",
		rev, u["old"] / c["old"], u["new"] / c["new"], (u["new"] / c["new"]) / (u["old"] / c["old"])
}' rev="$rev" "$work/server.txt"
echo
echo "rounds: $count of $benchtime, interleaved; redis-server $(redis-server --version | cut -d' ' -f3); load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
