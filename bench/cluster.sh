#!/usr/bin/env bash
# Cluster pass-through: redis-benchmark SET/GET against a Redis Cluster of 3
# masters, once as a cluster client itself (redis-benchmark --cluster) and
# through hotkeyproxy in cluster mode (upstream.mode: cluster) in front of
# the same cluster, as configured by default (its scheduler sized to its
# load), the same with GOMAXPROCS=1 (hotkeyproxy-1p) and with GOMAXPROCS=N,
# the N CPUs of the machine (hotkeyproxy-Np, Go's own default), in one run,
# at pipeline depths 1 and 16.
#
#   bench/cluster.sh                 full run (3-4 minutes on a quiet machine,
#                                    longer when disturbed runs are retried)
#   BENCH_QUICK=1 bench/cluster.sh   smoke run (well under a minute)
#
# Environment (as in passthrough.sh, plus BENCH_MASTERS and BENCH_THREADS):
#   BENCH_N1, BENCH_N16   requests per test at depth 1 / 16
#                         (default 200000 / 1000000; quick 20000 / 100000)
#   BENCH_ROUNDS          rounds of (direct and each proxy) per depth; medians
#                         are reported (default 3; quick 1)
#   BENCH_CLIENTS         redis-benchmark -c (default 50)
#   BENCH_THREADS         redis-benchmark --threads, the same on both sides
#                         (default 1: one event loop, as in passthrough.sh;
#                         --cluster alone would take one thread per master)
#   BENCH_MASTERS         masters in the cluster, no replicas (default 3)
#   BENCH_TIMEOUT         seconds one redis-benchmark run may take (default 300)
#   BENCH_RETRIES         times a run that other processes disturbed (more than
#                         5% of the machine's CPU went to processes outside the
#                         benchmark) is run again, after waiting up to
#                         BENCH_QUIET_WAIT seconds (default 60) for a quiet
#                         machine (default 2; quick 0)
#   HOTKEYPROXY_BIN       use this binary instead of building one
#   BENCH_KEEP=1          keep the temp dir (logs, raw TSV)
#
# What each side does:
#   direct       redis-benchmark --cluster -p <master 0>: it reads CLUSTER
#                NODES, gives each of its connections one master (round
#                robin), and each connection only ever talks to that master.
#                Keys are key:{TAG}:<random 0..99999>, TAG one fixed slot of
#                that master (redis-benchmark 7.0 keeps to one slot per
#                master), so a batch (1 command at -P 1, 16 at -P 16) is one
#                pipeline to one node, with no redirection.
#   hotkeyproxy  plain redis-benchmark -p <proxy>: keys key:<random 0..99999>
#                spread over the masters by CRC16; the proxy routes each
#                command to its slot's master over its shared upstream
#                connections (upstream.conns_per_node, default 2 per master)
#                and returns the replies in order, so a 16-command pipeline
#                is split over the masters and merged back. hotkeyproxy-1p
#                is the same with GOMAXPROCS=1: one scheduler thread, which on
#                cores shared with the masters and the client costs less;
#                hotkeyproxy-Np with GOMAXPROCS=N, the machine's CPUs.
#
# Every process it starts listens on 127.0.0.1 on a free port and is
# stopped when the script exits. The table is printed and written to
# bench/results/cluster-<date>.md. Exit status 1 if any run failed.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ ${BENCH_QUICK:-0} == 1 ]]; then
	N1=${BENCH_N1:-20000} N16=${BENCH_N16:-100000} ROUNDS=${BENCH_ROUNDS:-1} RETRIES=${BENCH_RETRIES:-0}
else
	N1=${BENCH_N1:-200000} N16=${BENCH_N16:-1000000} ROUNDS=${BENCH_ROUNDS:-3} RETRIES=${BENCH_RETRIES:-2}
fi
QUIET_WAIT=${BENCH_QUIET_WAIT:-60}
CLIENTS=${BENCH_CLIENTS:-50}
THREADS=${BENCH_THREADS:-1}
MASTERS=${BENCH_MASTERS:-3}
RUN_TIMEOUT=${BENCH_TIMEOUT:-300}
KEYSPACE=100000
DEPTHS=(1 16)
NCPU=$(nproc)
TARGETS=(direct hotkeyproxy hotkeyproxy-1p)
if ((NCPU > 1)); then TARGETS+=("hotkeyproxy-${NCPU}p"); fi

for tool in go redis-server redis-benchmark redis-cli ss timeout; do
	command -v "$tool" >/dev/null || bench_die "$tool not found"
done

bench_init
bench_build_proxy
bench_start_cluster "$MASTERS"
# How each target is reached, and the proxy whose CPU its runs count (for
# direct, the default one, idle).
declare -A ARGS=([direct]="--cluster -h 127.0.0.1 -p ${CLUSTER_PORTS[0]}") PROXY_OF=()
PROXY_PIDS=()
for t in "${TARGETS[@]:1}"; do
	bench_start_target "$t" "$CLUSTER_SEEDS" 'upstream: {mode: cluster}'
	ARGS[$t]="-h 127.0.0.1 -p $PROXY_PORT" PROXY_OF[$t]=$PROXY_PID
	PROXY_PIDS+=("$PROXY_PID")
done
PROXY_OF[direct]=${PROXY_OF[hotkeyproxy]}
CLK_TCK=$(getconf CLK_TCK)
bench_log "cluster $CLUSTER_SEEDS, $(for t in "${TARGETS[@]:1}"; do printf '%s %s  ' "$t" "${ARGS[$t]}"; done)"

# Sanity: a value written through the proxy reads back from the cluster
# (redis-cli -c follows redirections), and the other way round, for 3 keys
# per master (with 3 masters, these 9 land on every one).
for ((i = 0; i < 3 * MASTERS; i++)); do
	redis-cli -h 127.0.0.1 -p "$PROXY_PORT" set "bench:sanity:$i" "via-proxy-$i" >/dev/null
	got=$(redis-cli -c -h 127.0.0.1 -p "${CLUSTER_PORTS[0]}" get "bench:sanity:$i")
	[[ $got == "via-proxy-$i" ]] || bench_die "hotkeyproxy: wrote via-proxy-$i to bench:sanity:$i, the cluster has '$got'"
	redis-cli -c -h 127.0.0.1 -p "${CLUSTER_PORTS[0]}" set "bench:sanity:$i" "direct-$i" >/dev/null
	for name in "${TARGETS[@]:1}"; do
		got=$(redis-cli ${ARGS[$name]} get "bench:sanity:$i")
		[[ $got == "direct-$i" ]] || bench_die "$name: bench:sanity:$i is direct-$i in the cluster, the proxy says '$got'"
	done
done

RAW=$BENCH_TMP/raw.tsv # depth test target round rps p50 p99 proxy_us redis_us hit% client_us other%
: >"$RAW"
PROBLEMS=$BENCH_TMP/problems.txt
: >"$PROBLEMS"
NOISE=$BENCH_TMP/noise.txt # runs that processes outside the benchmark disturbed
: >"$NOISE"
RERUNS=$BENCH_TMP/reruns.txt # disturbed runs discarded and run again
: >"$RERUNS"
# A run is reported as disturbed when other processes took more than this
# share (%) of the machine's CPU time during it.
OTHER_MAX=5

# cluster_stat FIELD: FIELD of INFO stats summed over the masters.
cluster_stat() {
	local port sum=0 v
	for port in "${CLUSTER_PORTS[@]}"; do
		v=$(redis-cli -h 127.0.0.1 -p "$port" info stats | tr -d '\r' | awk -F: -v f="$1" '$1 == f {print $2}')
		sum=$((sum + ${v:-0}))
	done
	echo "$sum"
}

# bench_run_once TARGET DEPTH N ROUND: one redis-benchmark run; sets
# RUN_ROWS (its rows for $RAW) and RUN_OTHER (% of the machine's CPU that
# other processes took meanwhile), or appends a line to $PROBLEMS and
# returns 1.
bench_run_once() {
	local t=$1 depth=$2 n=$3 round=$4
	local out=$BENCH_TMP/rb-$t-P$depth-r$round.csv err=$BENCH_TMP/rb-$t-P$depth-r$round.err rc=0
	local start=$SECONDS pcpu0 rcpu0 pcpu rcpu hits0 miss0 errs0 hit errs busy0 ns0 ccpu other both0
	local proxy=${PROXY_OF[$t]}
	local tf=$BENCH_TMP/rb-$t-P$depth-r$round.time
	hits0=$(cluster_stat keyspace_hits) miss0=$(cluster_stat keyspace_misses) errs0=$(cluster_stat total_error_replies)
	pcpu0=$(bench_cpu_ticks "$proxy") both0=$(bench_cpu_ticks "${PROXY_PIDS[@]}")
	rcpu0=$(bench_cpu_ticks "${CLUSTER_PIDS[@]}")
	busy0=$(bench_busy_ticks) ns0=$(date +%s%N)
	# The time keyword reports redis-benchmark's own CPU time (user, system).
	# shellcheck disable=SC2086 # ARGS holds several words
	{ TIMEFORMAT='%3U %3S' && time timeout "$RUN_TIMEOUT" redis-benchmark ${ARGS[$t]} --threads "$THREADS" \
		-c "$CLIENTS" -n "$n" -r "$KEYSPACE" -t set,get -P "$depth" --csv >"$out" 2>"$err" || rc=$?; } 2>"$tf"
	# Machine CPU time during the run that neither the proxy, the masters
	# nor redis-benchmark used, as a share of all CPUs' time: other
	# processes on the machine, which skew the numbers.
	other=$(awk -v b0="$busy0" -v b1="$(bench_busy_ticks)" -v ns0="$ns0" -v ns1="$(date +%s%N)" -v hz="$CLK_TCK" \
		-v p0="$both0" -v p1="$(bench_cpu_ticks "${PROXY_PIDS[@]}")" -v r0="$rcpu0" -v r1="$(bench_cpu_ticks "${CLUSTER_PIDS[@]}")" \
		-v cpus="$NCPU" -v tf="$(cat "$tf")" 'BEGIN {
			split(tf, c, " "); mine = (p1 - p0) + (r1 - r0) + (c[1] + c[2]) * hz
			o = 100 * ((b1 - b0) - mine) / ((ns1 - ns0) / 1e9 * hz * cpus)
			printf "%.0f", o < 0 ? 0 : o
		}')
	ccpu=$(awk -v tf="$(cat "$tf")" -v n="$n" 'BEGIN {split(tf, c, " "); printf "%.2f", (c[1] + c[2]) * 1e6 / (2 * n)}')
	# CPU time per request, SET and GET runs together, of the proxy (what
	# it spends when idle, for direct) and of all the masters together.
	pcpu=$(awk -v a="$pcpu0" -v b="$(bench_cpu_ticks "$proxy")" -v hz="$CLK_TCK" -v n="$n" \
		'BEGIN {printf "%.2f", (b - a) * 1e6 / hz / (2 * n)}')
	rcpu=$(awk -v a="$rcpu0" -v b="$(bench_cpu_ticks "${CLUSTER_PIDS[@]}")" -v hz="$CLK_TCK" -v n="$n" \
		'BEGIN {printf "%.2f", (b - a) * 1e6 / hz / (2 * n)}')
	# Share of GETs that found their key (SET does not count in these).
	hit=$(awk -v h="$(($(cluster_stat keyspace_hits) - hits0))" -v m="$(($(cluster_stat keyspace_misses) - miss0))" \
		'BEGIN {if (h + m > 0) printf "%.1f", 100 * h / (h + m); else print "0"}')
	errs=$(($(cluster_stat total_error_replies) - errs0))
	if ((rc == 124)); then
		echo "$t P$depth round $round: redis-benchmark did not finish in ${RUN_TIMEOUT}s (hang?)" >>"$PROBLEMS"
	elif ((rc != 0)); then
		echo "$t P$depth round $round: redis-benchmark exited $rc: $(tr '\r\n' '  ' <"$err" | cut -c1-300)" >>"$PROBLEMS"
	fi
	if ((errs != 0)); then
		echo "$t P$depth round $round: the masters sent $errs error replies (INFO stats total_error_replies)" >>"$PROBLEMS"
	fi
	# Anything on stderr other than the CONFIG warning proxies cause.
	grep -v -e '^WARNING: Could not fetch server CONFIG' -e '^[[:space:]]*$' "$err" |
		sed "s/^/$t P$depth round $round stderr: /" | head -n 5 >>"$PROBLEMS" || true
	local rows
	rows=$(awk -F, -v d="$depth" -v t="$t" -v r="$round" -v pc="$pcpu" -v rc="$rcpu" -v hit="$hit" -v cc="$ccpu" -v o="$other" '
		$1 == "\"SET\"" || $1 == "\"GET\"" {
			for (i = 1; i <= NF; i++) gsub(/"/, "", $i)
			print d "\t" $1 "\t" t "\t" r "\t" $2 "\t" $5 "\t" $7 "\t" pc "\t" rc "\t" ($1 == "GET" ? hit : "-") "\t" cc "\t" o
		}' "$out")
	local j
	for j in "${TARGETS[@]:1}"; do
		bench_alive "${PROXY_OF[$j]}" || bench_die "$j died during $t P$depth round $round"
	done
	for ((j = 0; j < MASTERS; j++)); do
		bench_alive "${CLUSTER_PIDS[j]}" || bench_die "redis-cluster-$j died during $t P$depth round $round"
	done
	if [[ $(grep -c . <<<"$rows") -ne 2 ]]; then
		((rc != 0)) || echo "$t P$depth round $round: no SET/GET rows in CSV output" >>"$PROBLEMS"
		return 1
	fi
	bench_log "  $t P$depth: $(awk -F'\t' '{printf "%s %.0f/s p99 %sms  ", $2, $5, $7}' <<<"$rows")cpu proxy ${pcpu} redis ${rcpu} client ${ccpu}µs/req, GET hits ${hit}%, other processes ${other}% ($((SECONDS - start))s)"
	RUN_ROWS=$rows RUN_OTHER=$other
}

# bench_run TARGET DEPTH N ROUND: bench_run_once, run again (up to RETRIES
# times, each after waiting for a quiet machine) while other processes
# disturbed it; appends the rows of the last run to $RAW.
bench_run() {
	local t=$1 depth=$2 n=$3 round=$4 try
	for ((try = 0; ; try++)); do
		bench_run_once "$t" "$depth" "$n" "$round" || return 0
		((RUN_OTHER > OTHER_MAX && try < RETRIES)) || break
		echo "$t P$depth round $round: other processes took ${RUN_OTHER}%; discarded, run again" >>"$RERUNS"
		bench_log "  disturbed (other processes ${RUN_OTHER}%); waiting up to ${QUIET_WAIT}s for a quiet machine to run it again"
		bench_wait_quiet "$OTHER_MAX" "$QUIET_WAIT" || bench_log "  still busy; running it anyway"
	done
	printf '%s\n' "$RUN_ROWS" >>"$RAW"
	if ((RUN_OTHER > OTHER_MAX)); then
		echo "$t P$depth round $round: other processes took ${RUN_OTHER}% of the machine's CPU during the run" >>"$NOISE"
	fi
}

# Warm-up: fill both sides' key spaces alike, to about 95% (3 random SETs
# per key: key:<n> through the proxy; key:{TAG}:<n> with one TAG per master
# directly, so MASTERS times as many keys), so that GETs hit about as often
# on both sides in every round, and give each target a short run of its own.
bench_log "warm-up"
# shellcheck disable=SC2086
redis-benchmark ${ARGS[hotkeyproxy]} -c "$CLIENTS" -n $((3 * KEYSPACE)) -r "$KEYSPACE" \
	-t set -P 16 -q >/dev/null 2>&1 || bench_die "warm-up through hotkeyproxy failed"
# shellcheck disable=SC2086
redis-benchmark ${ARGS[direct]} --threads "$THREADS" -c "$CLIENTS" -n $((3 * MASTERS * KEYSPACE)) -r "$KEYSPACE" \
	-t set -P 16 -q >/dev/null 2>&1 || bench_die "warm-up of the cluster directly failed"
for t in "${TARGETS[@]}"; do
	# shellcheck disable=SC2086
	timeout "$RUN_TIMEOUT" redis-benchmark ${ARGS[$t]} --threads "$THREADS" -c "$CLIENTS" -n 20000 \
		-r "$KEYSPACE" -t set,get -P 16 -q >/dev/null 2>&1 ||
		echo "$t warm-up: redis-benchmark failed" >>"$PROBLEMS"
done
bench_wait_sized

bench_rounds

keys_per_master=""
for port in "${CLUSTER_PORTS[@]}"; do
	keys_per_master+="${keys_per_master:+ / }$(redis-cli -h 127.0.0.1 -p "$port" dbsize)"
done

# Stops the proxies now, so that their logs are complete.
for pid in "${PROXY_PIDS[@]}"; do bench_stop "$pid"; done
grep -E 'level=(WARN|ERROR)|"level":"(WARN|ERROR)"|panic|fatal' "$BENCH_TMP"/hotkeyproxy*.log | head -n 10 |
	sed 's/^/hotkeyproxy log: /' >>"$PROBLEMS" || true

cpu_model=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
redis_version=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
rb_version=$(redis-benchmark --version 2>/dev/null | awk '{print $2; exit}')
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
		rps[k] = rps[k] " " $5; p50[k] = p50[k] " " $6; p99[k] = p99[k] " " $7
		pcpu[k] = pcpu[k] " " $8; rcpu[k] = rcpu[k] " " $9; hit[k] = hit[k] " " $10; ccpu[k] = ccpu[k] " " $11
		other[k] = other[k] " " $12; runs[k]++
	}
	END {
		nt = split("SET GET", tests, " "); ng = split(targets_list, targets, " ")
		print "| depth | test | target | requests/s | p50 ms | p99 ms | vs direct | rps min–max (runs) | proxy CPU µs/req | Redis CPU µs/req | client CPU µs/req | GET hits | other CPU % (max) |"
		print "|---:|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"
		for (i = 1; i <= nd; i++) for (j = 1; j <= nt; j++) for (g = 1; g <= ng; g++) {
			k = depths[i] SUBSEP tests[j] SUBSEP targets[g]
			if (!(k in rps)) continue
			d = depths[i] SUBSEP tests[j] SUBSEP "direct"
			ratio = (d in rps) ? sprintf("%.2f", median(rps[k]) / median(rps[d])) : "–"
			pc = targets[g] == "direct" ? "–" : sprintf("%.2f", median(pcpu[k]))
			h = tests[j] == "GET" ? sprintf("%.0f%%", median(hit[k])) : "–"
			printf "| %s | %s | %s | %.0f | %.3f | %.3f | %s | %.0f–%.0f (%d) | %s | %.2f | %.2f | %s | %.0f |\n", depths[i], tests[j], targets[g],
				median(rps[k]), median(p50[k]), median(p99[k]), ratio, lo(rps[k]), hi(rps[k]), runs[k], pc, median(rcpu[k]),
				median(ccpu[k]), h, hi(other[k])
		}
	}' "$RAW")

report=$(
	echo "# hotkeyproxy cluster pass-through benchmark, $(date '+%Y-%m-%d %H:%M:%S %Z')"
	echo
	echo "redis-benchmark --threads $THREADS -c $CLIENTS -r $KEYSPACE -t set,get --csv; n=$N1 at -P 1, n=$N16 at -P 16;" \
		"median of $ROUNDS interleaved round(s), against a Redis Cluster of $MASTERS masters (no replicas)." \
		"'vs direct' is requests/s relative to the direct cluster client."
	echo
	echo "- direct: redis-benchmark --cluster, seeded with master 0. Each of its $CLIENTS connections is given one master" \
		"(round robin) and only talks to it; keys are key:{TAG}:<random>, TAG one fixed slot of that master" \
		"(redis-benchmark ${rb_version:-?} keeps to one slot per master), so a batch (1 command at -P 1, 16 at -P 16)" \
		"is one pipeline to one master and nothing is redirected."
	echo "- hotkeyproxy: plain redis-benchmark against hotkeyproxy (upstream.mode cluster, seeds: all masters)." \
		"Keys are key:<random>, spread over the masters by CRC16; the proxy routes each command to its slot's master" \
		"over shared upstream connections and returns replies in order, so a 16-command pipeline is split over the" \
		"masters and merged back, with its scheduler sized to its load (one thread while it needs less than a core)." \
		"hotkeyproxy-1p: the same binary with GOMAXPROCS=1 (one scheduler thread); hotkeyproxy-${NCPU}p: with GOMAXPROCS=$NCPU, the machine's CPUs, which Go sets by default."
	echo "- proxy CPU µs/req: user+system CPU of hotkeyproxy per request (SET and GET runs together; – for direct, where it idles)." \
		"Redis CPU µs/req: the same for all $MASTERS redis-servers together; client CPU µs/req: the same for redis-benchmark." \
		"GET hits: share of GETs that found their key (INFO keyspace_hits/misses); both key spaces are filled alike at warm-up." \
		"other CPU %: the machine's busy CPU time (user, system, steal; not irq/softirq) during a run not used by the proxy, the masters or redis-benchmark," \
		"as a share of all ${NCPU} CPUs (other processes competing; the worst run of the row)."
	if [[ ${BENCH_QUICK:-0} == 1 ]]; then echo "- BENCH_QUICK=1: smoke run, numbers are rough."; fi
	echo
	echo "$table"
	echo
	echo "- machine: $(nproc) CPUs, $cpu_model, Linux $(uname -r)"
	echo "- redis-server $redis_version, cluster-enabled, no persistence; $(go version | sed 's/^go version //')"
	echo "- hotkeyproxy $commit, default config with upstream.mode cluster (upstream.conns_per_node 2); hotkeyproxy-1p the same with GOMAXPROCS=1, hotkeyproxy-${NCPU}p with GOMAXPROCS=$NCPU"
	echo "- keys per master at the end (DBSIZE): $keys_per_master"
	echo "- the $MASTERS redis-servers, the proxies and redis-benchmark share the machine's CPUs"
	if [[ -s $RERUNS ]]; then
		echo
		echo "Runs discarded and run again (other processes above ${OTHER_MAX}% of the machine's CPU; BENCH_RETRIES $RETRIES):"
		sed 's/^/- /' "$RERUNS"
	fi
	if [[ -s $NOISE ]]; then
		echo
		echo "Disturbed runs kept (other processes above ${OTHER_MAX}% of the machine's CPU; their numbers are skewed, rerun on a quiet machine):"
		sed 's/^/- /' "$NOISE"
	fi
	bench_problems "$PROBLEMS"
)
bench_save_report cluster "$report"
if grep -qv -e 'hotkeyproxy log:' -e 'stderr:' "$PROBLEMS"; then
	exit 1
fi
