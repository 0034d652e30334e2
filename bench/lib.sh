# shellcheck shell=bash
# Helpers shared by the bench scripts: free ports, starting redis-server (one,
# or a Redis Cluster of several), hotkeyproxy, nutcracker and predixy on
# 127.0.0.1, CPU accounting, CPU quotas by cgroup, and stopping every process
# the script started (and only those) when it exits. Source it, then call
# bench_init; it sets no shell options of its own.

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BENCH_ROOT=$(cd "$BENCH_DIR/.." && pwd)
BENCH_TMP=""
BENCH_PIDS=()  # processes started here; stopped in reverse order on exit
BENCH_NAMES=() # a name and log file for each, for error reports
BENCH_CLEANUP_HOOKS=() # commands run on exit after those processes stopped

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
	for ((i = ${#BENCH_CLEANUP_HOOKS[@]} - 1; i >= 0; i--)); do
		"${BENCH_CLEANUP_HOOKS[i]}" || true
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

# bench_cpu_ticks PID...: user + system CPU time of the processes, all
# threads, summed, in clock ticks (getconf CLK_TCK per second).
bench_cpu_ticks() {
	local pid sum=0
	for pid in "$@"; do
		sum=$((sum + $(sed 's/.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')))
	done
	echo "$sum"
}

# bench_busy_ticks: CPU time the whole machine has spent busy since boot,
# all CPUs, in clock ticks: user, nice, system and steal (the hypervisor's),
# but not irq and softirq time, which no process is charged with (much of it
# the benchmark's own loopback traffic).
bench_busy_ticks() { awk '$1 == "cpu" {print $2 + $3 + $4 + $9; exit}' /proc/stat; }

# bench_wait_quiet MAX_PCT TIMEOUT: waits until the machine has been busy
# (bench_busy_ticks) below MAX_PCT % of all its CPUs for 3 seconds in a row,
# or TIMEOUT seconds have passed; returns 1 on timeout.
bench_wait_quiet() {
	local max=$1 deadline=$((SECONDS + $2)) quiet=0 b0 b1 hz cpus
	hz=$(getconf CLK_TCK) cpus=$(nproc)
	while ((SECONDS < deadline)); do
		b0=$(bench_busy_ticks)
		sleep 1
		b1=$(bench_busy_ticks)
		if (((b1 - b0) * 100 < max * hz * cpus)); then quiet=$((quiet + 1)); else quiet=0; fi
		((quiet < 3)) || return 0
	done
	return 1
}

# bench_cpu_use TICKS0 TICKS1 NS0 NS1 REQUESTS: from CPU ticks of some
# processes (bench_cpu_ticks) before and after a run and the run's wall
# clock (date +%s%N), prints "PCT US": the share of one core they used, in
# %, and their CPU time per request, in µs ("-" with no requests).
bench_cpu_use() {
	awk -v t0="$1" -v t1="$2" -v n0="$3" -v n1="$4" -v n="$5" -v hz="$(getconf CLK_TCK)" 'BEGIN {
		s = (t1 - t0) / hz; w = (n1 - n0) / 1e9
		printf "%.1f %s\n", (w > 0 ? 100 * s / w : 0), (n > 0 ? sprintf("%.1f", s * 1e6 / n) : "-")
	}'
}

# bench_other_pct BUSY0 BUSY1 NS0 NS1 MINE: the share (%) of all the
# machine's CPUs that processes outside the benchmark used during a run:
# busy ticks (bench_busy_ticks) before and after, the wall clock (date
# +%s%N), and MINE, the ticks the benchmark's own processes used.
bench_other_pct() {
	awk -v b0="$1" -v b1="$2" -v n0="$3" -v n1="$4" -v mine="$5" -v hz="$(getconf CLK_TCK)" -v cpus="$(nproc)" 'BEGIN {
		o = 100 * ((b1 - b0) - mine) / ((n1 - n0) / 1e9 * hz * cpus)
		printf "%.0f\n", (o < 0 ? 0 : o)
	}'
}

# CPU placement, to give the processes of a benchmark CPUs of their own.
# bench_cpus LIST: the CPUs of a taskset list ("0,2-3"), one a line.
bench_cpus() {
	local part
	for part in ${1//,/ }; do
		if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
	done
}

# bench_own_cpus: the CPUs this script may run on, one a line.
bench_own_cpus() { bench_cpus "$(taskset -pc $$ | sed 's/.*: //')"; }

# bench_pin_init LIST: sets the CPUs of LIST (a taskset list) apart for the
# processes bench_pin moves there, and runs this script, and so all that it
# starts from now on, on the other CPUs it may use. Sets BENCH_PIN and
# BENCH_REST (a taskset list); dies when LIST leaves no CPU for the rest.
BENCH_PIN="" BENCH_REST=""
bench_pin_init() {
	command -v taskset >/dev/null || bench_die "taskset not found (util-linux)"
	BENCH_PIN=$1
	BENCH_REST=$(bench_own_cpus | grep -vxF -f <(bench_cpus "$1") | paste -sd,)
	[[ -n $BENCH_REST ]] || bench_die "CPUs $1 leave no CPU for the rest"
	taskset -pc "$BENCH_REST" $$ >/dev/null || bench_die "taskset -pc $BENCH_REST $$ failed"
}

# bench_pin PID: moves PID, every thread of it, to the CPUs bench_pin_init
# set apart. A Go program moved there follows within a second or so: its
# GOMAXPROCS tracks the CPUs it may use.
bench_pin() {
	taskset -a -pc "$BENCH_PIN" "$1" >/dev/null || bench_die "taskset -a -pc $BENCH_PIN $1 failed"
}

# CPU quotas by cgroup, to hold a process to a share of one core (so that
# a 2-core machine can stand in for one machine per Redis master).
# bench_cgroup_init finds a writable cpu controller — cgroup v1's cpu
# hierarchy (cpu.cfs_period_us, cpu.cfs_quota_us) or cgroup v2 with the cpu
# controller (cpu.max) — and makes a cgroup of its own for this run inside
# the one the script runs in; bench_cgroup_limit puts a process in a child
# of it with a quota; on exit, after the processes stopped, any process
# still in them is moved back and they are removed. Sets BENCH_CG_KIND (v1
# or v2) and BENCH_CG (the run's cgroup directory); dies with a clear
# message when neither version is writable here.
BENCH_CG="" BENCH_CG_KIND="" BENCH_CG_HOME="" BENCH_CG_CHILDREN=()
BENCH_CG_PERIOD=${BENCH_CG_PERIOD:-100000} # µs

# bench_cg_write FILE VALUE: writes VALUE to a cgroup file; fails quietly.
bench_cg_write() { { printf '%s\n' "$2" >"$1"; } 2>/dev/null; }

bench_cgroup_init() {
	local mnt fs opts ctl path v1="" v2="" why=""
	while read -r _ mnt fs opts _; do
		if [[ $fs == cgroup && ,$opts, == *,cpu,* && -z $v1 ]]; then v1=$mnt; fi
		if [[ $fs == cgroup2 && -z $v2 ]] && grep -qw cpu "$mnt/cgroup.controllers" 2>/dev/null; then v2=$mnt; fi
	done </proc/mounts
	local name
	name=$(basename "${BENCH_TMP:-hkp-bench.$$}")
	if [[ -n $v1 ]]; then
		# This process's cgroup in the cpu hierarchy: "N:cpu,cpuacct:/path".
		while IFS=: read -r _ ctl path; do
			if [[ ,$ctl, == *,cpu,* ]]; then break; fi
			path=""
		done </proc/self/cgroup
		BENCH_CG_HOME=${v1%/}${path%/}
		BENCH_CG=$BENCH_CG_HOME/$name
		if mkdir "$BENCH_CG" 2>/dev/null && [[ -w $BENCH_CG/cpu.cfs_quota_us ]]; then
			BENCH_CG_KIND=v1
		else
			why="cgroup v1: cannot make $BENCH_CG with a writable cpu.cfs_quota_us"
			rmdir "$BENCH_CG" 2>/dev/null || true
		fi
	fi
	if [[ -z $BENCH_CG_KIND && -n $v2 ]]; then
		path=$(awk -F: '$1 == "0" {print $3; exit}' /proc/self/cgroup)
		BENCH_CG_HOME=${v2%/}${path%/}
		BENCH_CG=$BENCH_CG_HOME/$name
		# Children get cpu.max only when their parent lends them the cpu
		# controller (cgroup.subtree_control), all the way down.
		if { grep -qw cpu "$BENCH_CG_HOME/cgroup.subtree_control" 2>/dev/null ||
			bench_cg_write "$BENCH_CG_HOME/cgroup.subtree_control" +cpu; } &&
			mkdir "$BENCH_CG" 2>/dev/null && bench_cg_write "$BENCH_CG/cgroup.subtree_control" +cpu; then
			BENCH_CG_KIND=v2
		else
			why="${why:+$why; }cgroup v2: cannot make $BENCH_CG with the cpu controller for its children (cgroup.subtree_control of $BENCH_CG_HOME)"
			rmdir "$BENCH_CG" 2>/dev/null || true
		fi
	fi
	if [[ -z $BENCH_CG_KIND ]]; then
		BENCH_CG=""
		[[ -n $v1 || -n $v2 ]] || why="no cgroup mount with the cpu controller in /proc/mounts"
		bench_die "no writable cgroup cpu controller, so no CPU quotas here ($why); run as root on a machine that has cgroup v1's cpu controller (/sys/fs/cgroup/cpu) or cgroup v2 with cpu enabled"
	fi
	BENCH_CLEANUP_HOOKS+=(bench_cgroup_cleanup)
	bench_log "CPU quotas by cgroup $BENCH_CG_KIND in $BENCH_CG"
}

# bench_cgroup_limit NAME PCT PID: holds PID (all its threads) to PCT % of
# one core, in the child cgroup NAME of the run's cgroup: a quota of
# PCT/100 of BENCH_CG_PERIOD µs every period.
bench_cgroup_limit() {
	local cg=$BENCH_CG/$1 pid=$3 quota tid
	quota=$(awk -v p="$2" -v per="$BENCH_CG_PERIOD" 'BEGIN {printf "%d", p * per / 100 + 0.5}')
	((quota >= 1000)) || bench_die "a quota of $2% of $BENCH_CG_PERIOD µs is ${quota} µs; the kernel wants at least 1000"
	[[ -d $cg ]] || mkdir "$cg" || bench_die "cannot make cgroup $cg"
	BENCH_CG_CHILDREN+=("$cg")
	if [[ $BENCH_CG_KIND == v1 ]]; then
		if ! bench_cg_write "$cg/cpu.cfs_period_us" "$BENCH_CG_PERIOD" || ! bench_cg_write "$cg/cpu.cfs_quota_us" "$quota"; then
			bench_die "cannot set cpu.cfs_period_us $BENCH_CG_PERIOD / cpu.cfs_quota_us $quota in $cg"
		fi
	else
		bench_cg_write "$cg/cpu.max" "$quota $BENCH_CG_PERIOD" || bench_die "cannot set cpu.max '$quota $BENCH_CG_PERIOD' in $cg"
	fi
	# cgroup.procs moves every thread of the process (v1's tasks file would
	# move only the one written, the others staying unlimited).
	if ! bench_cg_write "$cg/cgroup.procs" "$pid"; then
		[[ $BENCH_CG_KIND == v1 ]] || bench_die "cannot move pid $pid into $cg"
		for tid in /proc/"$pid"/task/*; do
			bench_cg_write "$cg/tasks" "${tid##*/}" || bench_die "cannot move thread ${tid##*/} of pid $pid into $cg"
		done
	fi
	grep -qx "$pid" "$cg/cgroup.procs" || bench_die "pid $pid is not in $cg after moving it there"
}

# bench_cgroup_stat NAME FIELD: FIELD of the child cgroup NAME's cpu.stat
# (nr_periods and nr_throttled exist in both versions).
bench_cgroup_stat() { awk -v f="$2" '$1 == f {print $2; exit}' "$BENCH_CG/$1/cpu.stat"; }

# bench_cgroup_cleanup: moves what is left in the run's cgroups back to the
# script's own and removes them.
bench_cgroup_cleanup() {
	local cg pid i
	[[ -n $BENCH_CG && -d $BENCH_CG ]] || return 0
	for cg in "${BENCH_CG_CHILDREN[@]}" "$BENCH_CG"; do
		[[ -d $cg ]] || continue
		while read -r pid; do
			[[ -n $pid ]] && bench_cg_write "$BENCH_CG_HOME/cgroup.procs" "$pid"
		done <"$cg/cgroup.procs"
		# A process that just exited may keep its cgroup busy a moment.
		for ((i = 0; i < 50; i++)); do
			rmdir "$cg" 2>/dev/null && break
			sleep 0.1
		done
		[[ ! -d $cg ]] || bench_log "could not remove cgroup $cg"
	done
	BENCH_CG=""
}

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

# bench_redis_server NAME PORT DIR LOG [EXTRA ARGS...]: starts redis-server
# on 127.0.0.1:PORT without persistence, working in DIR, logging to LOG;
# waits until it answers PING and sets BENCH_REDIS_PID.
bench_redis_server() {
	local name=$1 port=$2 dir=$3 log=$4
	shift 4
	redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
		--daemonize no --dir "$dir" --logfile "$log" "$@" >/dev/null 2>&1 &
	BENCH_REDIS_PID=$!
	bench_track "$name" "$log" "$BENCH_REDIS_PID"
	bench_wait_ping "$port" "$BENCH_REDIS_PID" "$name"
}

# bench_start_redis [EXTRA ARGS...]: starts redis-server; sets REDIS_PORT
# and REDIS_PID.
bench_start_redis() {
	REDIS_PORT=$(bench_free_port)
	bench_redis_server redis-server "$REDIS_PORT" "$BENCH_TMP" "$BENCH_TMP/redis.log" "$@"
	REDIS_PID=$BENCH_REDIS_PID
}

# bench_start_cluster N [EXTRA ARGS...]: starts a Redis Cluster of N masters
# without replicas: N cluster-enabled redis-servers, each with its own dir
# and a cluster bus port of its own (--cluster-port, since the default
# port+10000 may be above 65535 or taken); master i gets the i-th contiguous
# share of the 16384 slots and config epoch i+1, the first node MEETs the
# others, and it waits (up to 30 s) until every node reports
# cluster_state:ok, knows all N nodes and sees all slots assigned. Sets
# CLUSTER_PORTS and CLUSTER_PIDS (arrays, in slot order) and CLUSTER_SEEDS
# ("127.0.0.1:p1,127.0.0.1:p2,...").
bench_start_cluster() {
	local n=$1 i j port bus dir lo hi info bad deadline
	shift
	local taken=() buses=()
	CLUSTER_PORTS=() CLUSTER_PIDS=() CLUSTER_SEEDS=""
	for ((i = 0; i < n; i++)); do
		port=$(bench_free_port "${taken[@]}")
		taken+=("$port")
		bus=$(bench_free_port "${taken[@]}")
		taken+=("$bus")
		dir=$BENCH_TMP/cluster-$i
		mkdir -p "$dir"
		bench_redis_server "redis-cluster-$i" "$port" "$dir" "$dir/redis.log" \
			--cluster-enabled yes --cluster-config-file nodes.conf --cluster-port "$bus" "$@"
		CLUSTER_PORTS+=("$port")
		CLUSTER_PIDS+=("$BENCH_REDIS_PID")
		buses+=("$bus")
		CLUSTER_SEEDS+="${CLUSTER_SEEDS:+,}127.0.0.1:$port"
	done
	for ((i = 0; i < n; i++)); do
		lo=$((i * 16384 / n)) hi=$(((i + 1) * 16384 / n - 1))
		redis-cli -h 127.0.0.1 -p "${CLUSTER_PORTS[i]}" cluster addslotsrange "$lo" "$hi" | grep -qx OK ||
			bench_die "CLUSTER ADDSLOTSRANGE $lo $hi failed on :${CLUSTER_PORTS[i]}"
		# Distinct epochs, as redis-cli --cluster create sets them.
		redis-cli -h 127.0.0.1 -p "${CLUSTER_PORTS[i]}" cluster set-config-epoch $((i + 1)) | grep -qx OK ||
			bench_die "CLUSTER SET-CONFIG-EPOCH failed on :${CLUSTER_PORTS[i]}"
	done
	for ((i = 1; i < n; i++)); do
		redis-cli -h 127.0.0.1 -p "${CLUSTER_PORTS[0]}" cluster meet 127.0.0.1 "${CLUSTER_PORTS[i]}" "${buses[i]}" | grep -qx OK ||
			bench_die "CLUSTER MEET 127.0.0.1 ${CLUSTER_PORTS[i]} ${buses[i]} failed"
	done
	deadline=$((SECONDS + 30))
	while :; do
		bad=""
		for port in "${CLUSTER_PORTS[@]}"; do
			info=$(timeout 2 redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null | tr -d '\r') || true
			if ! grep -qx cluster_state:ok <<<"$info" || ! grep -qx "cluster_known_nodes:$n" <<<"$info" ||
				! grep -qx cluster_slots_assigned:16384 <<<"$info"; then
				bad=":$port: $(grep -E '^cluster_(state|known_nodes|slots_assigned):' <<<"$info" | tr '\n' ' ')"
				break
			fi
		done
		[[ -z $bad ]] && return 0
		for ((j = 0; j < n; j++)); do
			bench_alive "${CLUSTER_PIDS[j]}" || bench_die "redis-cluster-$j exited while the cluster formed"
		done
		((SECONDS < deadline)) || bench_die "cluster not ready within 30s; node $bad"
		sleep 0.05
	done
}

# bench_add_replicas [EXTRA ARGS...]: gives each master of bench_start_cluster
# a replica: a cluster-enabled redis-server that the first node MEETs and
# that CLUSTER REPLICATEs its master, the full sync started at once
# (repl-diskless-sync-delay 0 on the masters: Redis 7's default holds it 5 s).
# Waits (up to 30 s) until each replica's link is up and its offset is its
# master's. Sets REPLICA_PORTS (in the masters' order).
bench_add_replicas() {
	local i port bus dir id info deadline
	REPLICA_PORTS=()
	for ((i = 0; i < ${#CLUSTER_PORTS[@]}; i++)); do
		redis-cli -h 127.0.0.1 -p "${CLUSTER_PORTS[i]}" config set repl-diskless-sync-delay 0 >/dev/null
		port=$(bench_free_port "${CLUSTER_PORTS[@]}" "${REPLICA_PORTS[@]}")
		bus=$(bench_free_port "${CLUSTER_PORTS[@]}" "${REPLICA_PORTS[@]}" "$port")
		dir=$BENCH_TMP/replica-$i
		mkdir -p "$dir"
		bench_redis_server "redis-replica-$i" "$port" "$dir" "$dir/redis.log" \
			--cluster-enabled yes --cluster-config-file nodes.conf --cluster-port "$bus" "$@"
		REPLICA_PORTS+=("$port")
		redis-cli -h 127.0.0.1 -p "${CLUSTER_PORTS[0]}" cluster meet 127.0.0.1 "$port" "$bus" | grep -qx OK ||
			bench_die "CLUSTER MEET 127.0.0.1 $port $bus failed"
	done
	for ((i = 0; i < ${#CLUSTER_PORTS[@]}; i++)); do
		id=$(redis-cli -h 127.0.0.1 -p "${CLUSTER_PORTS[i]}" cluster myid)
		deadline=$((SECONDS + 30))
		# CLUSTER REPLICATE fails with "Unknown node" until gossip told it.
		until redis-cli -h 127.0.0.1 -p "${REPLICA_PORTS[i]}" cluster replicate "$id" 2>/dev/null | grep -qx OK; do
			((SECONDS < deadline)) || bench_die "replica :${REPLICA_PORTS[i]} cannot replicate $id"
			sleep 0.05
		done
		until info=$(redis-cli -h 127.0.0.1 -p "${CLUSTER_PORTS[i]}" info replication | tr -d '\r') &&
			grep -q "^slave0:.*state=online,offset=$(sed -n 's/^master_repl_offset://p' <<<"$info")," <<<"$info"; do
			((SECONDS < deadline)) || bench_die "replica :${REPLICA_PORTS[i]} not in sync within 30s"
			sleep 0.05
		done
	done
}

# bench_start_proxy UPSTREAM [YAML LINES...]: starts hotkeyproxy in front of
# UPSTREAM, a port on 127.0.0.1 or a list host:port[,host:port...] (the
# seeds of a cluster, with the YAML line 'upstream: {mode: cluster}'), with a
# config holding the YAML lines (metrics off unless given); sets PROXY_PORT
# and PROXY_PID. PROXY_NAME (default hotkeyproxy) names its config and log
# files, for a second instance.
bench_start_proxy() {
	local up=$1
	shift
	[[ $up == *:* ]] || up=127.0.0.1:$up
	PROXY_PORT=$(bench_free_port)
	local name=${PROXY_NAME:-hotkeyproxy}
	local conf=$BENCH_TMP/$name.yaml log=$BENCH_TMP/$name.log line
	{
		echo "# written by bench/lib.sh"
		echo 'metrics: {listen: ""}'
		for line in "$@"; do echo "$line"; done
	} >"$conf"
	"$HKP_BIN" --config "$conf" --listen "127.0.0.1:$PROXY_PORT" \
		--upstream "$up" >"$log" 2>&1 &
	PROXY_PID=$!
	bench_track "$name" "$log" "$PROXY_PID"
	bench_wait_ping "$PROXY_PORT" "$PROXY_PID" "$name"
}

# bench_start_target NAME UPSTREAM [YAML LINES...]: bench_start_proxy as the
# target NAME: hotkeyproxy as shipped, which sizes its scheduler to its load
# (internal/gomaxprocs), or hotkeyproxy-Np, the same with GOMAXPROCS=N.
bench_start_target() {
	local name=$1 procs
	shift
	if [[ $name == hotkeyproxy ]]; then
		BENCH_SIZED_AT=$((SECONDS + 31))
		bench_start_proxy "$@"
		return
	fi
	procs=${name#hotkeyproxy-}
	PROXY_NAME=$name GOMAXPROCS=${procs%p} bench_start_proxy "$@"
}

# bench_wait_sized: waits until the shipped build, started by
# bench_start_target, has narrowed its scheduler if it is to: after 30 s
# without needing more than a core, as a proxy in service long has.
BENCH_SIZED_AT=0
bench_wait_sized() {
	if ((SECONDS < BENCH_SIZED_AT)); then sleep $((BENCH_SIZED_AT - SECONDS)); fi
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

# bench_start_predixy UPSTREAM_PORT: starts predixy ($PREDIXY, a built
# binary) with one worker thread and a standalone server pool of one Redis
# server; sets PREDIXY_PORT, PREDIXY_PID and PREDIXY_CONF.
bench_start_predixy() {
	local up=$1 log=$BENCH_TMP/predixy.log
	[[ -x ${PREDIXY:-} ]] || bench_die "PREDIXY=${PREDIXY:-} is not an executable"
	PREDIXY_PORT=$(bench_free_port)
	PREDIXY_CONF=$BENCH_TMP/predixy.conf
	# One worker thread, as the other proxies have one event loop; no
	# client or server timeout, no log but warnings and errors; the fixed
	# group's first (only) address is its master.
	cat >"$PREDIXY_CONF" <<-CONF
		Name bench
		Bind 127.0.0.1:$PREDIXY_PORT
		WorkerThreads 1
		ClientTimeout 0
		LogVerbSample 0
		LogDebugSample 0
		LogInfoSample 0
		LogNoticeSample 0
		LogWarnSample 1
		LogErrorSample 1
		StandaloneServerPool {
		    Hash crc16
		    Distribution modula
		    RefreshMethod fixed
		    ServerTimeout 0
		    Group bench {
		        + 127.0.0.1:$up
		    }
		}
	CONF
	"$PREDIXY" "$PREDIXY_CONF" >"$log" 2>&1 &
	PREDIXY_PID=$!
	bench_track predixy "$log" "$PREDIXY_PID"
	bench_wait_ping "$PREDIXY_PORT" "$PREDIXY_PID" predixy
}

# bench_start_floorrelay UPSTREAM_PORT: builds bench/floorrelay and starts
# it in front of the Redis on UPSTREAM_PORT; sets FLOOR_PORT and FLOOR_PID.
bench_start_floorrelay() {
	local up=$1 bin=$BENCH_TMP/floorrelay log=$BENCH_TMP/floorrelay.log
	(cd "$BENCH_ROOT" && go build -o "$bin" ./bench/floorrelay) || bench_die "building floorrelay failed"
	FLOOR_PORT=$(bench_free_port)
	"$bin" -listen "127.0.0.1:$FLOOR_PORT" -upstream "127.0.0.1:$up" >"$log" 2>&1 &
	FLOOR_PID=$!
	bench_track floorrelay "$log" "$FLOOR_PID"
	bench_wait_ping "$FLOOR_PORT" "$FLOOR_PID" floorrelay
}

# bench_save_report NAME REPORT: prints REPORT and writes it to
# bench/results/NAME-<date>[-quick].md (-quick under BENCH_QUICK=1).
bench_save_report() {
	local file suffix=""
	if [[ ${BENCH_QUICK:-0} == 1 ]]; then suffix=-quick; fi
	echo
	echo "$2"
	mkdir -p "$BENCH_DIR/results"
	file=$BENCH_DIR/results/$1-$(date +%Y-%m-%d-%H%M%S)$suffix.md
	echo "$2" >"$file"
	bench_log "wrote $file"
}

# bench_problems FILE: a report's "Problems:" section, a line of FILE an
# item; nothing when FILE is empty.
bench_problems() {
	if [[ -s $1 ]]; then
		echo
		echo "Problems:"
		sed 's/^/- /' "$1"
	fi
}

# bench_rounds: the measurement, in interleaved rounds: each round runs
# every target once, starting with a different one each round, so drift
# and noise hit every target alike. Uses DEPTHS, N1, N16, ROUNDS, TARGETS
# and the script's bench_run TARGET DEPTH N ROUND.
bench_rounds() {
	local depth n round k
	for depth in "${DEPTHS[@]}"; do
		n=$N1
		[[ $depth == 1 ]] || n=$N16
		for ((round = 1; round <= ROUNDS; round++)); do
			bench_log "P$depth round $round/$ROUNDS (n=$n)"
			for ((k = 0; k < ${#TARGETS[@]}; k++)); do
				bench_run "${TARGETS[(k + round - 1) % ${#TARGETS[@]}]}" "$depth" "$n" "$round"
			done
		done
	done
}
