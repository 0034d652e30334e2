# shellcheck shell=bash
# Helpers shared by the bench scripts: free ports, starting redis-server,
# hotkeyproxy and nutcracker on 127.0.0.1, and stopping every process the
# script started (and only those) when it exits. Source it, then call
# bench_init; it sets no shell options of its own.

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BENCH_ROOT=$(cd "$BENCH_DIR/.." && pwd)
BENCH_TMP=""
BENCH_PIDS=()  # processes started here; stopped in reverse order on exit
BENCH_NAMES=() # a name and log file for each, for error reports

bench_log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
bench_die() { bench_log "error: $*"; exit 1; }

# bench_init makes the temp dir and installs the exit trap.
bench_init() {
	BENCH_TMP=$(mktemp -d "${TMPDIR:-/tmp}/hkp-bench.XXXXXX")
	trap bench_cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}

# bench_alive PID: the process exists and is not a zombie.
bench_alive() {
	local st
	st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1) || return 1
	[[ -n $st && $st != Z && $st != X ]]
}

# bench_kill PID: SIGTERM, up to 10 s of grace, then SIGKILL; reaps it.
bench_kill() {
	local pid=$1 i
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		bench_alive "$pid" || break
		sleep 0.1
	done
	if bench_alive "$pid"; then
		bench_log "pid $pid ignored SIGTERM for 10s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || true
}

# bench_untrack PID: forget a process that has been reaped, so that its
# (possibly reused) pid is never signalled again.
bench_untrack() {
	local i
	for ((i = 0; i < ${#BENCH_PIDS[@]}; i++)); do
		if [[ ${BENCH_PIDS[i]} == "$1" ]]; then
			BENCH_PIDS=("${BENCH_PIDS[@]:0:i}" "${BENCH_PIDS[@]:i+1}")
			BENCH_NAMES=("${BENCH_NAMES[@]:0:i}" "${BENCH_NAMES[@]:i+1}")
			return
		fi
	done
}

# bench_stop PID: stops a process started here and forgets it.
bench_stop() {
	bench_kill "$1"
	bench_untrack "$1"
}

bench_cleanup() {
	local rc=$? i
	trap - EXIT INT TERM
	for ((i = ${#BENCH_PIDS[@]} - 1; i >= 0; i--)); do
		if [[ $rc -ne 0 ]] && ! bench_alive "${BENCH_PIDS[i]}"; then
			bench_log "${BENCH_NAMES[i]%% *} (pid ${BENCH_PIDS[i]}) had already exited"
		fi
		bench_kill "${BENCH_PIDS[i]}"
	done
	if [[ $rc -ne 0 && -n $BENCH_TMP ]]; then
		for ((i = 0; i < ${#BENCH_NAMES[@]}; i++)); do
			local f=${BENCH_NAMES[i]#* }
			if [[ -s $f ]]; then
				bench_log "last lines of ${BENCH_NAMES[i]%% *} log ($f):"
				tail -n 15 "$f" >&2 || true
			fi
		done
	fi
	if [[ -n $BENCH_TMP ]]; then
		if [[ ${BENCH_KEEP:-0} == 1 || $rc -ne 0 ]]; then
			bench_log "kept $BENCH_TMP"
		else
			rm -rf "$BENCH_TMP"
		fi
	fi
	exit "$rc"
}

# bench_track NAME LOG PID: remember a started process.
bench_track() {
	BENCH_NAMES+=("$1 $2")
	BENCH_PIDS+=("$3")
}

# bench_free_port [EXCLUDE...]: a TCP port nobody listens on or uses, below
# the ephemeral range so that outgoing connections cannot take it meanwhile.
bench_free_port() {
	local lo hi p i x used
	read -r lo hi </proc/sys/net/ipv4/ip_local_port_range
	local base=20000 span=$((lo - 20000))
	if ((span < 1000)); then base=$((hi + 1)) span=$((65535 - hi)); fi
	for ((i = 0; i < 500; i++)); do
		p=$((base + (RANDOM * 32768 + RANDOM) % span))
		used=0
		for x in "$@"; do [[ $x == "$p" ]] && used=1; done
		((used)) && continue
		if [[ -z $(ss -Htan "( sport = :$p or dport = :$p )" 2>/dev/null) ]]; then
			echo "$p"
			return 0
		fi
	done
	bench_die "no free port found"
}

# bench_wait_ping PORT PID NAME: wait (up to 10 s) until PORT answers PING.
bench_wait_ping() {
	local port=$1 pid=$2 name=$3 i
	for ((i = 0; i < 200; i++)); do
		bench_alive "$pid" || bench_die "$name exited during start-up"
		if [[ $(timeout 2 redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null) == PONG ]]; then
			return 0
		fi
		sleep 0.05
	done
	bench_die "$name on port $port did not answer PING within 10s"
}

# bench_rss_kib PID: VmRSS of PID in KiB.
bench_rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

# bench_build_proxy: builds hotkeyproxy into $BENCH_TMP (or takes
# $HOTKEYPROXY_BIN) and sets HKP_BIN.
bench_build_proxy() {
	if [[ -n ${HOTKEYPROXY_BIN:-} ]]; then
		HKP_BIN=$HOTKEYPROXY_BIN
		bench_log "using $HKP_BIN"
		return
	fi
	bench_log "building hotkeyproxy"
	(cd "$BENCH_ROOT" && go build -o "$BENCH_TMP/hotkeyproxy" .) || bench_die "go build failed"
	HKP_BIN=$BENCH_TMP/hotkeyproxy
}

# bench_start_redis [EXTRA ARGS...]: starts redis-server; sets REDIS_PORT
# and REDIS_PID.
bench_start_redis() {
	REDIS_PORT=$(bench_free_port)
	local log=$BENCH_TMP/redis.log
	redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
		--daemonize no --dir "$BENCH_TMP" --logfile "$log" "$@" >/dev/null 2>&1 &
	REDIS_PID=$!
	bench_track redis-server "$log" "$REDIS_PID"
	bench_wait_ping "$REDIS_PORT" "$REDIS_PID" redis-server
}

# bench_start_proxy UPSTREAM_PORT [YAML LINES...]: starts hotkeyproxy in
# front of 127.0.0.1:UPSTREAM_PORT with a config holding the YAML lines
# (metrics off unless given); sets PROXY_PORT and PROXY_PID.
bench_start_proxy() {
	local up=$1
	shift
	PROXY_PORT=$(bench_free_port)
	local conf=$BENCH_TMP/hotkeyproxy.yaml log=$BENCH_TMP/hotkeyproxy.log line
	{
		echo "# written by bench/lib.sh"
		echo 'metrics: {listen: ""}'
		for line in "$@"; do echo "$line"; done
	} >"$conf"
	"$HKP_BIN" --config "$conf" --listen "127.0.0.1:$PROXY_PORT" \
		--upstream "127.0.0.1:$up" >"$log" 2>&1 &
	PROXY_PID=$!
	bench_track hotkeyproxy "$log" "$PROXY_PID"
	bench_wait_ping "$PROXY_PORT" "$PROXY_PID" hotkeyproxy
}

# bench_start_twemproxy UPSTREAM_PORT: starts nutcracker with one Redis
# server; sets TWEM_PORT, TWEM_PID and TWEM_CONF.
bench_start_twemproxy() {
	local up=$1
	TWEM_PORT=$(bench_free_port)
	local stats
	stats=$(bench_free_port "$TWEM_PORT")
	TWEM_CONF=$BENCH_TMP/nutcracker.yml
	local log=$BENCH_TMP/nutcracker.log
	# No auto_eject_hosts (so server_retry_timeout and server_failure_limit
	# never apply), no timeout (wait for Redis as long as it takes, like
	# the direct client), connections opened at start.
	cat >"$TWEM_CONF" <<-YAML
		bench:
		  listen: 127.0.0.1:$TWEM_PORT
		  redis: true
		  hash: fnv1a_64
		  distribution: ketama
		  auto_eject_hosts: false
		  preconnect: true
		  server_connections: ${BENCH_TWEM_CONNS:-1}
		  backlog: 1024
		  servers:
		    - 127.0.0.1:$up:1
	YAML
	nutcracker -t -c "$TWEM_CONF" >"$log" 2>&1 || bench_die "nutcracker rejects $TWEM_CONF: $(cat "$log")"
	nutcracker -c "$TWEM_CONF" -a 127.0.0.1 -s "$stats" -i 600000 \
		-p "$BENCH_TMP/nutcracker.pid" -o "$log" -v 5 >/dev/null 2>&1 &
	TWEM_PID=$!
	bench_track nutcracker "$log" "$TWEM_PID"
	bench_wait_ping "$TWEM_PORT" "$TWEM_PID" nutcracker
}
