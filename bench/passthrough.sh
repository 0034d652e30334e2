#!/usr/bin/env bash
# Pass-through overhead: redis-benchmark SET/GET against Redis directly,
# through hotkeyproxy (as configured by default, which sizes its scheduler
# to its load; the same with GOMAXPROCS=1: hotkeyproxy-1p; and, when it may
# use N > 1 CPUs, with GOMAXPROCS=N, Go's own default: hotkeyproxy-Np) and
# through twemproxy (nutcracker), and through
# predixy when a build of it is given and the Go floor (floorrelay) when
# asked, all on one Redis in one run, at pipeline depths 1 and 16.
#
#   bench/passthrough.sh                 full run (a few minutes)
#   BENCH_QUICK=1 bench/passthrough.sh   smoke run (well under a minute)
#
# Environment:
#   BENCH_N1, BENCH_N16   requests per test at depth 1 / 16
#                         (default 200000 / 1000000; quick 20000 / 100000)
#   BENCH_ROUNDS          rounds of (direct and each proxy) per depth;
#                         medians are reported (default 3; quick 1)
#   BENCH_CLIENTS         redis-benchmark -c (default 50)
#   BENCH_TIMEOUT         seconds one redis-benchmark run may take (default 300)
#   BENCH_TWEM_CONNS      nutcracker server_connections (default 1)
#   PREDIXY               a predixy binary: adds predixy (one worker thread,
#                         a standalone server pool of the same Redis) to
#                         every round; not installed by anything here
#   BENCH_FLOOR=1         adds floorrelay (bench/floorrelay: one goroutine
#                         on a level-triggered epoll, framing only, no
#                         proxy): the least CPU per request a Go relay
#                         spends here, to read the others' figures against
#   BENCH_PROXY_CPUS      CPUs (a taskset list, e.g. 0) the proxies run on,
#                         apart from Redis and redis-benchmark, which run on
#                         the others: each proxy has them to itself, as on a
#                         host of its own (Go sets hotkeyproxy's GOMAXPROCS
#                         from them). Default: every process on every CPU
#   HOTKEYPROXY_BIN       use this binary instead of building one
#   BENCH_KEEP=1          keep the temp dir (logs, raw CSV)
#
# Every process it starts listens on 127.0.0.1 on a free port and is
# stopped when the script exits. The table is printed and written to
# bench/results/passthrough-<date>.md. Exit status 1 if any run failed.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ ${BENCH_QUICK:-0} == 1 ]]; then
	N1=${BENCH_N1:-20000} N16=${BENCH_N16:-100000} ROUNDS=${BENCH_ROUNDS:-1}
else
	N1=${BENCH_N1:-200000} N16=${BENCH_N16:-1000000} ROUNDS=${BENCH_ROUNDS:-3}
fi
CLIENTS=${BENCH_CLIENTS:-50}
RUN_TIMEOUT=${BENCH_TIMEOUT:-300}
KEYSPACE=100000
DEPTHS=(1 16)

for tool in go redis-server redis-benchmark redis-cli nutcracker ss timeout; do
	command -v "$tool" >/dev/null || bench_die "$tool not found"
done

bench_init
NCPU=$(nproc) # before any pinning narrows what nproc counts
if [[ -n ${BENCH_PROXY_CPUS:-} ]]; then bench_pin_init "$BENCH_PROXY_CPUS"; fi
NPROXY=$NCPU # the CPUs the proxies may use
if [[ -n $BENCH_PIN ]]; then NPROXY=$(bench_cpus "$BENCH_PIN" | grep -c .); fi
TARGETS=(direct hotkeyproxy hotkeyproxy-1p)
if ((NPROXY > 1)); then TARGETS+=("hotkeyproxy-${NPROXY}p"); fi
TARGETS+=(twemproxy)
if [[ -n ${PREDIXY:-} ]]; then TARGETS+=(predixy); fi
if [[ ${BENCH_FLOOR:-0} == 1 ]]; then TARGETS+=(floorrelay); fi
bench_build_proxy
# shellcheck disable=SC2119 # no extra redis-server arguments
bench_start_redis
declare -A PORT=([direct]=$REDIS_PORT) PID=([direct]=$REDIS_PID)
for t in "${TARGETS[@]}"; do
	if [[ $t == hotkeyproxy* ]]; then
		bench_start_target "$t" "$REDIS_PORT"
		PORT[$t]=$PROXY_PORT PID[$t]=$PROXY_PID
	fi
done
bench_start_twemproxy "$REDIS_PORT"
PORT[twemproxy]=$TWEM_PORT PID[twemproxy]=$TWEM_PID
if [[ -n $BENCH_PIN ]]; then for t in "${!PID[@]}"; do [[ $t == direct ]] || bench_pin "${PID[$t]}"; done; fi
if [[ -n ${PREDIXY:-} ]]; then
	bench_start_predixy "$REDIS_PORT"
	if [[ -n $BENCH_PIN ]]; then bench_pin "$PREDIXY_PID"; fi
	PORT[predixy]=$PREDIXY_PORT PID[predixy]=$PREDIXY_PID
	PREDIXY_VERSION=$(redis-cli -h 127.0.0.1 -p "$PREDIXY_PORT" info server 2>/dev/null | tr -d '\r' |
		sed -n 's/^Version:\(.*\)/\1/p' | head -n 1)
fi
if [[ ${BENCH_FLOOR:-0} == 1 ]]; then
	bench_start_floorrelay "$REDIS_PORT"
	if [[ -n $BENCH_PIN ]]; then bench_pin "$FLOOR_PID"; fi
	PORT[floorrelay]=$FLOOR_PORT PID[floorrelay]=$FLOOR_PID
fi
CLK_TCK=$(getconf CLK_TCK)
bench_log "redis-server :$REDIS_PORT, $(for t in "${TARGETS[@]:1}"; do printf '%s :%s ' "$t" "${PORT[$t]}"; done)"

# Sanity: a value written through each proxy reads back directly.
for t in "${TARGETS[@]:1}"; do
	redis-cli -h 127.0.0.1 -p "${PORT[$t]}" set "bench:sanity:$t" "ok-$t" >/dev/null
	got=$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" get "bench:sanity:$t")
	[[ $got == "ok-$t" ]] || bench_die "$t: wrote ok-$t, Redis has '$got'"
done

RAW=$BENCH_TMP/raw.tsv # depth test target round rps p50 p99 cpu_us_per_req

: >"$RAW"
PROBLEMS=$BENCH_TMP/problems.txt
: >"$PROBLEMS"

# bench_run TARGET DEPTH N ROUND: one redis-benchmark run; appends its rows
# to $RAW, or a line to $PROBLEMS.
bench_run() {
	local t=$1 depth=$2 n=$3 round=$4
	local out=$BENCH_TMP/rb-$t-P$depth-r$round.csv err=$BENCH_TMP/rb-$t-P$depth-r$round.err rc=0
	local start=$SECONDS cpu0 cpu
	cpu0=$(bench_cpu_ticks "${PID[$t]}")
	timeout "$RUN_TIMEOUT" redis-benchmark -h 127.0.0.1 -p "${PORT[$t]}" -c "$CLIENTS" -n "$n" \
		-r "$KEYSPACE" -t set,get -P "$depth" --csv >"$out" 2>"$err" || rc=$?
	# CPU time the target process (Redis for direct, else the proxy) spent
	# per request, over the SET and GET tests together.
	cpu=$(awk -v a="$cpu0" -v b="$(bench_cpu_ticks "${PID[$t]}")" -v hz="$CLK_TCK" -v n="$n" \
		'BEGIN {printf "%.2f", (b - a) * 1e6 / hz / (2 * n)}')
	if ((rc == 124)); then
		echo "$t P$depth round $round: redis-benchmark did not finish in ${RUN_TIMEOUT}s (hang?)" >>"$PROBLEMS"
	elif ((rc != 0)); then
		echo "$t P$depth round $round: redis-benchmark exited $rc: $(tr '\r\n' '  ' <"$err" | cut -c1-300)" >>"$PROBLEMS"
	fi
	# Anything on stderr other than the CONFIG warning proxies cause.
	grep -v -e '^WARNING: Could not fetch server CONFIG' -e '^[[:space:]]*$' "$err" |
		sed "s/^/$t P$depth round $round stderr: /" | head -n 5 >>"$PROBLEMS" || true
	local rows
	rows=$(awk -F, -v d="$depth" -v t="$t" -v r="$round" -v c="$cpu" '
		$1 == "\"SET\"" || $1 == "\"GET\"" {
			for (i = 1; i <= NF; i++) gsub(/"/, "", $i)
			print d "\t" $1 "\t" t "\t" r "\t" $2 "\t" $5 "\t" $7 "\t" c
		}' "$out")
	if [[ $(grep -c . <<<"$rows") -ne 2 ]]; then
		((rc != 0)) || echo "$t P$depth round $round: no SET/GET rows in CSV output" >>"$PROBLEMS"
		return 0
	fi
	printf '%s\n' "$rows" >>"$RAW"
	bench_log "  $t P$depth: $(awk -F'\t' '{printf "%s %.0f/s p99 %sms  ", $2, $5, $7}' <<<"$rows")cpu ${cpu}µs/req ($((SECONDS - start))s)"
	bench_alive "${PID[$t]}" || bench_die "$t died during $t P$depth round $round"
}

# Warm-up: fill the key space (so GETs hit in every round) and give each
# target a short run of its own.
bench_log "warm-up"
redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c "$CLIENTS" -n "$KEYSPACE" -r "$KEYSPACE" \
	-t set -P 16 -q >/dev/null 2>&1 || bench_die "warm-up against Redis failed"
for t in "${TARGETS[@]}"; do
	timeout "$RUN_TIMEOUT" redis-benchmark -h 127.0.0.1 -p "${PORT[$t]}" -c "$CLIENTS" -n 20000 \
		-r "$KEYSPACE" -t set,get -P 16 -q >/dev/null 2>&1 ||
		echo "$t warm-up: redis-benchmark failed" >>"$PROBLEMS"
done
bench_wait_sized

bench_rounds

# Stops the proxies now, so their logs are complete.
if [[ -n ${PREDIXY:-} ]]; then
	bench_stop "$PREDIXY_PID"
	grep -E ' (W|E) ' "$BENCH_TMP/predixy.log" | head -n 5 | sed 's/^/predixy log: /' >>"$PROBLEMS" || true
fi
bench_stop "$TWEM_PID"
for t in "${TARGETS[@]}"; do [[ $t != hotkeyproxy* ]] || bench_stop "${PID[$t]}"; done
grep -E 'level=(WARN|ERROR)|"level":"(WARN|ERROR)"|panic|fatal' "$BENCH_TMP"/hotkeyproxy*.log | head -n 10 |
	sed 's/^/hotkeyproxy log: /' >>"$PROBLEMS" || true

cpu_model=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
redis_version=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
commit=$(git -C "$BENCH_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n $(git -C "$BENCH_ROOT" status --porcelain 2>/dev/null) ]]; then commit="$commit (with uncommitted changes)"; fi

# Medians per (depth, test, target).
table=$(awk -F'\t' -v targets_list="${TARGETS[*]}" '
	function median(s,   a, n, i, j, x) {
		n = split(s, a, " ")
		for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	function lo(s,   a, n, i, m) { n = split(s, a, " "); m = a[1] + 0; for (i = 2; i <= n; i++) if (a[i] + 0 < m) m = a[i] + 0; return m }
	function hi(s,   a, n, i, m) { n = split(s, a, " "); m = a[1] + 0; for (i = 2; i <= n; i++) if (a[i] + 0 > m) m = a[i] + 0; return m }
	{
		if (!($1 in seen)) { seen[$1] = 1; depths[++nd] = $1 }
		k = $1 SUBSEP $2 SUBSEP $3
		rps[k] = rps[k] " " $5; p50[k] = p50[k] " " $6; p99[k] = p99[k] " " $7; cpu[k] = cpu[k] " " $8; runs[k]++
	}
	END {
		nt = split("SET GET", tests, " "); ng = split(targets_list, targets, " ")
		print "| depth | test | target | requests/s | p50 ms | p99 ms | vs direct | rps min–max (runs) | CPU µs/req |"
		print "|---:|---|---|---:|---:|---:|---:|---|---:|"
		for (i = 1; i <= nd; i++) for (j = 1; j <= nt; j++) for (g = 1; g <= ng; g++) {
			k = depths[i] SUBSEP tests[j] SUBSEP targets[g]
			if (!(k in rps)) continue
			d = depths[i] SUBSEP tests[j] SUBSEP "direct"
			ratio = (d in rps) ? sprintf("%.2f", median(rps[k]) / median(rps[d])) : "–"
			printf "| %s | %s | %s | %.0f | %.3f | %.3f | %s | %.0f–%.0f (%d) | %.2f |\n", depths[i], tests[j], targets[g],
				median(rps[k]), median(p50[k]), median(p99[k]), ratio, lo(rps[k]), hi(rps[k]), runs[k], median(cpu[k])
		}
	}' "$RAW")

report=$(
	echo "# hotkeyproxy pass-through benchmark, $(date '+%Y-%m-%d %H:%M:%S %Z')"
	echo
	echo "redis-benchmark -c $CLIENTS -r $KEYSPACE -t set,get --csv; n=$N1 at -P 1, n=$N16 at -P 16;" \
		"median of $ROUNDS interleaved round(s). 'vs direct' is requests/s relative to Redis directly." \
		"CPU µs/req: user+system CPU of the target process (redis-server for direct, else the proxy alone) per request, SET and GET runs together."
	if [[ ${BENCH_QUICK:-0} == 1 ]]; then echo "BENCH_QUICK=1: smoke run, numbers are rough."; fi
	echo
	echo "$table"
	echo
	echo "- machine: $NCPU CPUs, $cpu_model, Linux $(uname -r)"
	echo "- redis-server $redis_version; $(nutcracker -V 2>&1 | head -n 1); $(go version | sed 's/^go version //')"
	echo "- hotkeyproxy $commit, default config (upstream.conns_per_node 2; GOMAXPROCS sized to its load: one thread while it needs less than a core); hotkeyproxy-1p: the same with GOMAXPROCS=1 (one scheduler thread, as twemproxy and predixy with one worker have)$(if ((NPROXY > 1)); then echo "; hotkeyproxy-${NPROXY}p: with GOMAXPROCS=$NPROXY, the CPUs it may use, which Go sets by default"; fi)"
	echo "- twemproxy: redis: true, one server, server_connections ${BENCH_TWEM_CONNS:-1}, preconnect, auto_eject_hosts false, no timeout"
	if [[ -n ${PREDIXY:-} ]]; then
		echo "- predixy ${PREDIXY_VERSION:-?} ($PREDIXY): WorkerThreads 1, a StandaloneServerPool with one server (RefreshMethod fixed), no client or server timeout"
	fi
	if [[ ${BENCH_FLOOR:-0} == 1 ]]; then
		echo "- floorrelay: bench/floorrelay, one goroutine on a level-triggered epoll over the clients and one Redis connection, RESP framing only; no proxy, the floor of a relay in Go"
	fi
	if [[ -n $BENCH_PIN ]]; then
		echo "- the proxies run on CPU $BENCH_PIN (hotkeyproxy's GOMAXPROCS: $(bench_cpus "$BENCH_PIN" | wc -l), as Go sets it from the CPUs it may use), redis-server and redis-benchmark on CPU $BENCH_REST"
	else
		echo "- redis-server, the proxies and redis-benchmark share the machine's CPUs"
	fi
	bench_problems "$PROBLEMS"
)
bench_save_report passthrough "$report"
if grep -qv -e 'hotkeyproxy log:' -e 'predixy log:' -e 'stderr:' "$PROBLEMS"; then
	exit 1
fi
