# Shared by run.sh and compare.sh (sourced, not run): the pinning of the
# server and the benchmarks to separate cores, and a redis-server of their
# own on a free loopback port.
#
#   . "$here/server.sh"
#   make_work              # sets work, a directory removed on exit
#   pin_cores              # sets server_pin and client_pin (PIN=0: none)
#   start_server "$work"   # sets pid and port, or exits; stop_server stops it
#   start_cluster "$dir"   # a 3-master Redis Cluster: sets cluster_pids and
#                          # cluster_addrs, or exits; stop_cluster stops it

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

# port_free reports whether nothing answers on loopback port $1.
port_free() {
	! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# A Redis Cluster of three masters without replicas, as the tests start it
# (internal/redistest): each node on a free loopback port in 20000-44999
# whose cluster bus port (port+10000) is free too, pinned like the single
# server, keeping no data, with its files in dir/PORT; joined with
# redis-cli --cluster create and ready when every node reports
# cluster_state:ok. Sets cluster_pids and cluster_addrs (host:port,
# comma-separated); tries three times, then exits.
cluster_pids=()
start_cluster() { # dir
	local dir=$1 try n p pid ports ok
	for try in 1 2 3; do
		ports=()
		ok=1
		for n in 1 2 3; do
			p=
			for _ in $(seq 1 50); do
				p=$((20000 + RANDOM % 25000))
				case " ${ports[*]} " in *" $p "* | *" $((p + 10000)) "* | *" $((p - 10000)) "*) p= && continue ;; esac
				if port_free "$p" && port_free $((p + 10000)); then break; fi
				p=
			done
			[ -n "$p" ] || { ok=0 && break; }
			mkdir -p "$dir/$p"
			"${server_pin[@]}" redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no \
				--dir "$dir/$p" --logfile "$dir/$p/redis.log" --cluster-enabled yes \
				--cluster-config-file "$dir/$p/nodes.conf" --cluster-node-timeout 2000 &
			pid=$!
			cluster_pids+=("$pid")
			ports+=("$p")
			# Ready when the server on the port is this one (a port taken
			# meanwhile by another server must not join the cluster).
			ok=0
			for _ in $(seq 1 100); do
				if redis-cli -p "$p" info server 2>/dev/null | tr -d '\r' | grep -qx "process_id:$pid"; then ok=1 && break; fi
				kill -0 "$pid" 2>/dev/null || break
				sleep 0.05
			done
			[ "$ok" = 1 ] || break
		done
		if [ "$ok" = 1 ] && timeout 60 redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") \
			--cluster-yes </dev/null >"$dir/create.log" 2>&1; then
			for _ in $(seq 1 200); do
				ok=1
				for p in "${ports[@]}"; do
					redis-cli -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || { ok=0 && break; }
				done
				if [ "$ok" = 1 ]; then
					cluster_addrs=$(printf '127.0.0.1:%s,' "${ports[@]}")
					cluster_addrs=${cluster_addrs%,}
					return 0
				fi
				sleep 0.1
			done
		fi
		stop_cluster
		rm -rf "$dir"
	done
	echo "$(basename "$0"): could not start a redis cluster" >&2
	exit 1
}

# Stops the nodes start_cluster started, if any (by their PIDs).
stop_cluster() {
	local p
	for p in ${cluster_pids[@]+"${cluster_pids[@]}"}; do
		kill "$p" 2>/dev/null || true
	done
	for p in ${cluster_pids[@]+"${cluster_pids[@]}"}; do
		wait "$p" 2>/dev/null || true
	done
	cluster_pids=()
}

# Makes the scratch directory work; on exit the servers are stopped,
# cleanup_more is run if the script defines it, and work is removed.
make_work() {
	work=$(mktemp -d)
	trap 'stop_server; stop_cluster; if declare -F cleanup_more >/dev/null; then cleanup_more; fi; rm -rf "$work"' EXIT
	trap 'exit 130' INT TERM
}
