#!/usr/bin/env bash
# Idle-client memory: resident memory of hotkeyproxy (and, for comparison,
# twemproxy and redis-server) before and after N idle clients connect.
#
#   bench/idle_rss.sh                  10000 clients
#   BENCH_QUICK=1 bench/idle_rss.sh    1000 clients, shorter settle time
#
# Environment:
#   IDLE_CLIENTS   connections (default 10000; quick 1000)
#   IDLE_SETTLE    seconds between the two "after" readings (default 5; quick 2)
#   IDLE_TARGETS   which servers to measure, in order
#                  (default "hotkeyproxy twemproxy redis", with "baseline"
#                  first when IDLE_BASELINE_BIN is set)
#   IDLE_BASELINE_BIN  another hotkeyproxy binary (an older build), measured
#                  as the target "baseline" in the same run
#   HOTKEYPROXY_BIN, BENCH_KEEP=1   as in passthrough.sh
#
# Each target runs on its own (the others idle, unconnected), on 127.0.0.1,
# free ports; everything started is stopped on exit.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ ${BENCH_QUICK:-0} == 1 ]]; then
	CLIENTS=${IDLE_CLIENTS:-1000} SETTLE=${IDLE_SETTLE:-2}
else
	CLIENTS=${IDLE_CLIENTS:-10000} SETTLE=${IDLE_SETTLE:-5}
fi
default_targets="hotkeyproxy twemproxy redis"
if [[ -n ${IDLE_BASELINE_BIN:-} ]]; then default_targets="baseline $default_targets"; fi
read -r -a TARGETS <<<"${IDLE_TARGETS:-$default_targets}"

for tool in go redis-server redis-cli nutcracker ss timeout; do
	command -v "$tool" >/dev/null || bench_die "$tool not found"
done

# Room for CLIENTS sockets in this script's children (the servers and
# idleclients inherit the limit). The hard limit may be below 65536 in a
# container; then take what it allows.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
nofile=$(ulimit -n)
((nofile >= CLIENTS + 200)) || bench_die "open-file limit $nofile is too low for $CLIENTS clients"

bench_init
bench_build_proxy
bench_log "building idleclients"
(cd "$BENCH_ROOT" && go build -o "$BENCH_TMP/idleclients" ./bench/idleclients) || bench_die "go build idleclients failed"

# Redis must take the clients itself when it is a target, plus the proxies'.
bench_start_redis --maxclients $((CLIENTS + 100))
# max_clients above CLIENTS, so that all of them fit (default 10000).
if [[ -n ${IDLE_BASELINE_BIN:-} ]]; then
	own_bin=$HKP_BIN HKP_BIN=$IDLE_BASELINE_BIN
	bench_start_proxy "$REDIS_PORT" "limits: {max_clients: $((CLIENTS * 2))}"
	mv "$BENCH_TMP/hotkeyproxy.log" "$BENCH_TMP/baseline.log" # it keeps writing there
	BASE_PORT=$PROXY_PORT BASE_PID=$PROXY_PID HKP_BIN=$own_bin
	redis-cli -h 127.0.0.1 -p "$BASE_PORT" set bench:idle ok >/dev/null
fi
bench_start_proxy "$REDIS_PORT" "limits: {max_clients: $((CLIENTS * 2))}"
bench_start_twemproxy "$REDIS_PORT"
bench_log "redis-server :$REDIS_PORT, hotkeyproxy :$PROXY_PORT, nutcracker :$TWEM_PORT; open-file limit $nofile"
# One request through each proxy, so both have their upstream connection.
redis-cli -h 127.0.0.1 -p "$PROXY_PORT" set bench:idle ok >/dev/null
redis-cli -h 127.0.0.1 -p "$TWEM_PORT" get bench:idle >/dev/null
sleep 1

status_kib() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }

rows=()
failed=0
for t in "${TARGETS[@]}"; do
	case $t in
	hotkeyproxy) pid=$PROXY_PID port=$PROXY_PORT ;;
	baseline)
		[[ -n ${BASE_PID:-} ]] || bench_die "target baseline needs IDLE_BASELINE_BIN"
		pid=$BASE_PID port=$BASE_PORT
		;;
	twemproxy) pid=$TWEM_PID port=$TWEM_PORT ;;
	redis) pid=$REDIS_PID port=$REDIS_PORT ;;
	*) bench_die "unknown target $t" ;;
	esac
	before=$(bench_rss_kib "$pid")
	out=$BENCH_TMP/idleclients-$t.out
	bench_log "$t: RSS ${before} KiB; connecting $CLIENTS idle clients"
	"$BENCH_TMP/idleclients" -addr "127.0.0.1:$port" -n "$CLIENTS" -hold 10m >"$out" 2>&1 &
	ic=$!
	bench_track idleclients "$out" "$ic"
	for ((i = 0; i < 1200; i++)); do
		grep -qs '^ready' "$out" && break
		bench_alive "$ic" || break
		sleep 0.1
	done
	if ! grep -qs '^ready' "$out"; then
		bench_log "$t: idleclients did not get ready:"
		cat "$out" >&2
		bench_stop "$ic"
		rows+=("| $t | $before | – | – | – | – | failed: $(head -n 3 "$out" | tr '\n' ' ') |")
		failed=1
		continue
	fi
	bench_log "$t: $(head -n 1 "$out")"
	after=$(bench_rss_kib "$pid")
	sleep "$SETTLE"
	settled=$(bench_rss_kib "$pid")
	hwm=$(status_kib "$pid" VmHWM)
	threads=$(status_kib "$pid" Threads)
	kill -INT "$ic"
	rc=0
	wait "$ic" || rc=$?
	bench_untrack "$ic"
	note=$(grep -v '^ready' "$out" | tr '\n' ' ' | sed 's/ *$//')
	((rc == 0)) || failed=1
	sleep 1
	closed=$(bench_rss_kib "$pid")
	per=$(awk -v a="$settled" -v b="$before" -v n="$CLIENTS" 'BEGIN {printf "%.1f", (a - b) / n}')
	bench_log "$t: RSS before $before, connected $after, +${SETTLE}s $settled, peak $hwm, after close $closed KiB; $per KiB/client; $note"
	rows+=("| $t | $before | $after | $settled | $per | $closed | threads $threads, peak $hwm KiB; $note |")
	bench_alive "$pid" || bench_die "$t exited"
done

report=$(
	echo "# Idle-client memory, $(date '+%Y-%m-%d %H:%M:%S %Z')"
	echo
	echo "$CLIENTS idle clients (each sent one PING) held by one server at a time. RSS in KiB from /proc/PID/status;"
	echo "KiB/client = (RSS ${SETTLE}s after all connected − RSS before) / $CLIENTS."
	echo
	echo "| target | RSS before | RSS all connected | RSS +${SETTLE}s | KiB/client | RSS after close | notes |"
	echo "|---|---:|---:|---:|---:|---:|---|"
	printf '%s\n' "${rows[@]}"
	echo
	echo "- machine: $(nproc) CPUs, $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo), Linux $(uname -r); $(go version | sed 's/^go version //')"
	if [[ -n ${IDLE_BASELINE_BIN:-} ]]; then echo "- baseline: $IDLE_BASELINE_BIN"; fi
	echo "- hotkeyproxy $(git -C "$BENCH_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown), limits.max_clients $((CLIENTS * 2)); redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'); $(nutcracker -V 2>&1 | head -n 1 | sed 's/^This is //')"
)
bench_save_report idle-rss "$report"
exit "$failed"
