# Shared by run.sh and compare.sh (sourced, not run): the pinning of the
# server and the benchmarks to separate cores, and a redis-server of their
# own on a free loopback port.
#
#   . "$here/server.sh"
#   make_work              # sets work, a directory removed on exit
#   pin_cores              # sets server_pin and client_pin (PIN=0: none)
#   start_server "$work"   # sets pid and port, or exits; stop_server stops it

# Pin redis-server to CPU 0 and the benchmarks to the others, when there
# are at least two and taskset is here.
pin_cores() {
	ncpu=$(nproc)
	server_pin=() client_pin=()
	if [ "${PIN:-1}" != 0 ] && [ "$ncpu" -ge 2 ] && command -v taskset >/dev/null; then
		server_pin=(taskset -c 0)
		client_pin=(taskset -c "1-$((ncpu - 1))")
	fi
}

# A free loopback port: one nothing answers on; redis-server fails to
# start if it was taken meanwhile, and then the next one is tried. The
# server keeps no data (--save '' --appendonly no) and logs to dir.
start_server() { # dir
	local dir=$1 try
	pid=
	for try in $(seq 1 20); do
		port=$((20000 + RANDOM % 25000))
		(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue
		"${server_pin[@]}" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
			--dir "$dir" --logfile "$dir/redis.log" &
		pid=$!
		for _ in $(seq 1 100); do
			if redis-cli -p "$port" ping >/dev/null 2>&1; then return 0; fi
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.05
		done
		stop_server
	done
	echo "$(basename "$0"): could not start redis-server" >&2
	exit 1
}

# Stops the server start_server started, if any (by its PID).
stop_server() {
	if [ -n "${pid:-}" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	pid=
}

# Makes the scratch directory work; on exit the server is stopped,
# cleanup_more is run if the script defines it, and work is removed.
make_work() {
	work=$(mktemp -d)
	trap 'stop_server; if declare -F cleanup_more >/dev/null; then cleanup_more; fi; rm -rf "$work"' EXIT
	trap 'exit 130' INT TERM
}
