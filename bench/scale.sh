#!/usr/bin/env bash
# Scale-out of one hot key: do a hot key's deducts grow with the masters its
# buckets cover? On a 2-core machine, one machine per master is simulated by
# holding every Redis master to a fixed share of one core with a cgroup CPU
# quota (2% by default), so that Redis, not the shared cores, is the limit,
# and by running the masters on a CPU of their own, apart from the proxy and
# the load generator, which on a real cluster take neither a master's core
# nor its caches.
# For each cluster size M (1, 3, 5 masters, no replicas), in one run:
#
#   direct        deduct-one script (EVALSHA, `hotkeyproxy bench seckill`) on
#                 a plain key, straight to the master owning it
#   proxy-plain   the same plain key through hotkeyproxy (a relay)
#   proxy-hot     a hot key of 2·M buckets (2 per master) through hotkeyproxy
#   soldout-direct   once sold out, the same EVALSHA on the sold-out plain
#                 key straight to its master (redis-benchmark, timed)
#   soldout-proxy    the same on the sold-out hot key through the proxy,
#                 which answers "sold out" from memory
#   ping-proxy    PING through the proxy (redis-benchmark -t ping_mbulk): the
#                 proxy's own ceiling, no Redis involved
#
# with the proxy's CPU (user+system of its process, from /proc/PID/stat) per
# cell as % of one core and µs per request, the busiest master's CPU as % of
# a core and the share of its quota periods that were throttled (near 100%:
# Redis is the limit; low while the proxy is near a whole core: the proxy is).
#
#   bench/scale.sh                 full run (~8 minutes)
#   BENCH_QUICK=1 bench/scale.sh   smoke run (well under a minute: M = 1 3,
#                                  100 clients, 2 s cells, 1 round)
#
# Environment:
#   SCALE_MASTERS     cluster sizes, in order (default "1 3 5"; quick "1 3")
#   SCALE_QUOTA_PCT   each master's CPU quota, % of one core (default 2: at
#                     5 masters the proxy and the load generator then fit
#                     on the CPUs left to them)
#   SCALE_PIN         the CPUs the masters run on, as taskset takes them
#                     (default: the last CPU, when there are 2 or more; the
#                     script and all else run on the others); "none": the
#                     masters share every CPU with the rest
#   BENCH_CG_PERIOD   the quota's period in µs (default 50000: at 2% the
#                     kernel's shortest quota, 1 ms, so that a master runs
#                     in short bursts rather than stopping for 98 ms)
#   SCALE_CLIENTS     concurrent clients per cell, one connection each
#                     (default 1000; quick 100): enough that every cell is
#                     saturated (a closed loop of too few clients measures
#                     latency, not capacity)
#   SCALE_SECONDS     length of a cell (default 10; quick 2); the sale's stock
#                     (SCALE_STOCK, default 1000000000) outlasts it
#   SCALE_ROUNDS      rounds per cell; the best is reported (default 2; quick 1)
#   HOTKEYPROXY_BIN   use this binary instead of building one
#   BENCH_KEEP=1      keep the temp dir (logs, JSON results)
#
# Needs root (or a delegated cgroup) for the quotas: it says which cgroup
# version it uses, and exits with a message when neither is writable. The
# cgroups it makes are removed on exit. Every process it starts listens on
# 127.0.0.1 on a free port and is stopped when the script exits. The table
# is printed and written to bench/results/scale-<date>.md. Exit status 1 if
# a sale broke a guarantee or a run failed.
set -euo pipefail

BENCH_CG_PERIOD=${BENCH_CG_PERIOD:-50000}
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

QUICK=${BENCH_QUICK:-0}
if [[ $QUICK == 1 ]]; then
	MASTERS_LIST=${SCALE_MASTERS:-1 3} CLIENTS=${SCALE_CLIENTS:-100} SECS=${SCALE_SECONDS:-2} ROUNDS=${SCALE_ROUNDS:-1}
else
	MASTERS_LIST=${SCALE_MASTERS:-1 3 5} CLIENTS=${SCALE_CLIENTS:-1000} SECS=${SCALE_SECONDS:-10} ROUNDS=${SCALE_ROUNDS:-2}
fi
QUOTA_PCT=${SCALE_QUOTA_PCT:-2}

# PIN: the masters' CPUs, by default the last this script may use.
mapfile -t MINE < <(bench_own_cpus)
PIN=${SCALE_PIN:-none}
if [[ -z ${SCALE_PIN:-} && ${#MINE[@]} -gt 1 ]]; then PIN=${MINE[-1]}; fi
STOCK=${SCALE_STOCK:-1000000000}
read -r -a MASTERS_ARR <<<"$MASTERS_LIST"

for tool in go redis-server redis-benchmark redis-cli jq ss timeout; do
	command -v "$tool" >/dev/null || bench_die "$tool not found"
done
# One connection per client on each side, plus the proxy's and Redis's own.
if (($(ulimit -n) < 2 * CLIENTS + 100)); then
	ulimit -n $((2 * CLIENTS + 100)) 2>/dev/null || bench_die "ulimit -n $(ulimit -n) is too low for $CLIENTS clients"
fi

bench_init
bench_cgroup_init
if [[ $PIN != none ]]; then bench_pin_init "$PIN"; fi
bench_build_proxy
CLK_TCK=$(getconf CLK_TCK)
SCRIPTS=$(sed -n '/^scripts:/,/^metrics:/{/^metrics:/d;p}' "$BENCH_ROOT/proxy.yaml")
BODY=$(sed -n "s/^    body: \"\(if tonumber.*\)\"$/\1/p" "$BENCH_ROOT/proxy.yaml")
[[ -n $BODY ]] || bench_die "no deduct-one script body in proxy.yaml"

RAW=$BENCH_TMP/raw.tsv # M cell round ops/s requests proxy% proxyµs redis%max throttled%max other% lat sold oversell fso errors
: >"$RAW"
PROBLEMS=$BENCH_TMP/problems.txt
: >"$PROBLEMS"

# master_port KEY: the port of the master owning KEY's slot (master i holds
# the i-th contiguous share of the slots).
master_port() {
	local slot
	slot=$(redis-cli -p "${CLUSTER_PORTS[0]}" cluster keyslot "$1")
	echo "${CLUSTER_PORTS[slot * ${#CLUSTER_PORTS[@]} / 16384]}"
}

# The state around one cell: CPU ticks of the proxy and of each master, each
# master's throttled periods, the machine's busy ticks, the clock.
cell_begin() {
	local i
	C_P0=$(bench_cpu_ticks "$PROXY_PID") C_B0=$(bench_busy_ticks) C_N0=$(date +%s%N)
	C_R0=() C_T0=() C_Q0=()
	for ((i = 0; i < ${#CLUSTER_PIDS[@]}; i++)); do
		C_R0+=("$(bench_cpu_ticks "${CLUSTER_PIDS[i]}")")
		C_T0+=("$(bench_cgroup_stat "m$i" nr_throttled)") C_Q0+=("$(bench_cgroup_stat "m$i" nr_periods)")
	done
}

# cell_end M CELL ROUND OPS REQUESTS CLIENT_TICKS LAT SOLD OVERSELL FSO ERRORS:
# appends the cell's row to $RAW.
cell_end() {
	local n1 p1 b1 i r mine=0 rmax=0 tmax=0 use other pct
	n1=$(date +%s%N) p1=$(bench_cpu_ticks "$PROXY_PID") b1=$(bench_busy_ticks)
	for ((i = 0; i < ${#CLUSTER_PIDS[@]}; i++)); do
		r=$(($(bench_cpu_ticks "${CLUSTER_PIDS[i]}") - C_R0[i]))
		mine=$((mine + r))
		pct=$(bench_cpu_use 0 "$r" "$C_N0" "$n1" 0 | cut -d' ' -f1)
		rmax=$(awk -v a="$pct" -v b="$rmax" 'BEGIN {print (a > b ? a : b)}')
		pct=$(awk -v t="$(($(bench_cgroup_stat "m$i" nr_throttled) - C_T0[i]))" -v q="$(($(bench_cgroup_stat "m$i" nr_periods) - C_Q0[i]))" \
			'BEGIN {printf "%.0f", (q > 0 ? 100 * t / q : 0)}')
		tmax=$((pct > tmax ? pct : tmax))
	done
	use=$(bench_cpu_use "$C_P0" "$p1" "$C_N0" "$n1" "$5")
	other=$(bench_other_pct "$C_B0" "$b1" "$C_N0" "$n1" $((mine + p1 - C_P0 + $6)))
	printf '%s\t%s\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" \
		"${use% *}" "${use#* }" "$rmax" "$tmax" "$other" "$7" "$8" "$9" "${10}" "${11}" >>"$RAW"
	bench_log "  M=$1 $2 round $3: $(printf '%.0f' "$4")/s; proxy ${use% *}% of a core, ${use#* } µs/req; busiest master ${rmax}% (throttled ${tmax}% of periods); other processes ${other}%"
}

# sale M CELL ROUND ADDR KEY: a sale lasting SECS s (the stock outlasts it).
sale() {
	local m=$1 cell=$2 round=$3 out=$BENCH_TMP/M$1-$2-$3.json tf=$BENCH_TMP/M$1-$2-$3.time
	cell_begin
	{ TIMEFORMAT='%3U %3S' && time "$HKP_BIN" bench seckill --addr "$4" --key "$5" --stock "$STOCK" \
		--clients "$CLIENTS" --duration "${SECS}s" --json >"$out" 2>"$BENCH_TMP/M$m-$cell-$round.err" ||
		echo "M=$m $cell round $round: bench seckill exited non-zero: $(head -c 300 "$BENCH_TMP/M$m-$cell-$round.err")" >>"$PROBLEMS"; } 2>"$tf"
	[[ -s $out ]] || { echo "M=$m $cell round $round: no result" >>"$PROBLEMS" && return 0; }
	local ct
	ct=$(awk -v hz="$CLK_TCK" '{printf "%d", ($1 + $2) * hz}' "$tf")
	read -r ups reqs sold over fso errs p99 < <(jq -r '[.units_per_sec, .requests, .sold, .oversell, .false_sold_outs, .errors, .latency.ok.p99_ns] | @tsv' "$out")
	cell_end "$m" "$cell" "$round" "$ups" "$reqs" "$ct" "p99 $(awk -v n="$p99" 'BEGIN {printf "%.1f", n / 1e6}')" "$sold" "$over" "$fso" "$errs"
	if ((over + fso + errs > 0)); then
		echo "M=$m $cell round $round: oversell $over, false sold-outs $fso, errors $errs ($(jq -c '.error_samples // []' "$out" | head -c 200))" >>"$PROBLEMS"
	fi
}

# timed M CELL ROUND PORT TEST...: redis-benchmark for SECS s (stopped by
# timeout; its last progress line gives the overall rate).
timed() {
	local m=$1 cell=$2 round=$3 port=$4 out=$BENCH_TMP/M$1-$2-$3.rb tf=$BENCH_TMP/M$1-$2-$3.time rc=0
	shift 4
	cell_begin
	local n0=$C_N0
	{ TIMEFORMAT='%3U %3S' && time timeout "$SECS" redis-benchmark -h 127.0.0.1 -p "$port" -c "$CLIENTS" --threads 2 \
		-n 2000000000 "$@" >"$out" 2>"$BENCH_TMP/M$m-$cell-$round.err" || rc=$?; } 2>"$tf"
	local n1 rate lat ct
	n1=$(date +%s%N)
	((rc == 124)) || echo "M=$m $cell round $round: redis-benchmark exited $rc before its ${SECS}s: $(head -c 300 "$BENCH_TMP/M$m-$cell-$round.err")" >>"$PROBLEMS"
	rate=$(tr '\r' '\n' <"$out" | sed -n 's/.*(overall: \([0-9.]*\)) avg_msec=.*(overall: \([0-9.]*\)).*/\1 \2/p' | tail -1)
	[[ -n $rate ]] || { echo "M=$m $cell round $round: no progress line from redis-benchmark" >>"$PROBLEMS" && return 0; }
	lat="avg ${rate#* }"
	rate=${rate% *}
	ct=$(awk -v hz="$CLK_TCK" '{printf "%d", ($1 + $2) * hz}' "$tf")
	cell_end "$m" "$cell" "$round" "$rate" "$(awk -v r="$rate" -v a="$n0" -v b="$n1" 'BEGIN {printf "%d", r * (b - a) / 1e9}')" \
		"$ct" "$lat" - - - -
}

run_size() {
	local m=$1 i port round k cells
	bench_log "M=$m: a cluster of $m masters, each held to ${QUOTA_PCT}% of a core"
	bench_start_cluster "$m"
	for ((i = 0; i < m; i++)); do
		bench_cgroup_limit "m$i" "$QUOTA_PCT" "${CLUSTER_PIDS[i]}"
		if [[ $PIN != none ]]; then bench_pin "${CLUSTER_PIDS[i]}"; fi
		redis-cli -p "${CLUSTER_PORTS[i]}" script load "$BODY" >/dev/null
	done
	bench_start_proxy "$CLUSTER_SEEDS" 'upstream: {mode: cluster}' \
		"hotkeys: {keys: [{match: stock:hot, buckets: $((2 * m))}]}" "$SCRIPTS"
	local sha plain_port
	sha=$(redis-cli -p "$PROXY_PORT" script load "$BODY")
	plain_port=$(master_port stock:plain)
	# Warm-up: the proxy's connections, the hot key's layout.
	"$HKP_BIN" bench seckill --addr "127.0.0.1:$PROXY_PORT" --key stock:hot --stock "$STOCK" --clients 20 --duration 1s >/dev/null 2>&1 ||
		echo "M=$m warm-up sale failed" >>"$PROBLEMS"
	cells=(direct proxy-plain proxy-hot)
	for ((round = 1; round <= ROUNDS; round++)); do
		for ((k = 0; k < 3; k++)); do
			case ${cells[(k + round - 1) % 3]} in
			direct) sale "$m" direct "$round" "127.0.0.1:$plain_port" stock:plain ;;
			proxy-plain) sale "$m" proxy-plain "$round" "127.0.0.1:$PROXY_PORT" stock:plain ;;
			proxy-hot) sale "$m" proxy-hot "$round" "127.0.0.1:$PROXY_PORT" stock:hot ;;
			esac
		done
		# Sold out at once: no stock at all.
		redis-cli -p "$plain_port" set stock:plain 0 >/dev/null
		redis-cli -p "$PROXY_PORT" set stock:hot 0 >/dev/null
		[[ $(redis-cli -p "$plain_port" evalsha "$sha" 1 stock:plain) == -1 && $(redis-cli -p "$PROXY_PORT" evalsha "$sha" 1 stock:hot) == -1 ]] ||
			bench_die "M=$m: the deduct script on the emptied keys does not answer -1"
		timed "$m" soldout-direct "$round" "$plain_port" evalsha "$sha" 1 stock:plain
		timed "$m" soldout-proxy "$round" "$PROXY_PORT" evalsha "$sha" 1 stock:hot
		timed "$m" ping-proxy "$round" "$PROXY_PORT" -t ping_mbulk
		bench_alive "$PROXY_PID" || bench_die "hotkeyproxy died at M=$m"
	done
	# Stop this size's processes; keep their logs apart.
	bench_stop "$PROXY_PID"
	grep -E 'level=(WARN|ERROR)|"level":"(WARN|ERROR)"|panic|fatal' "$BENCH_TMP/hotkeyproxy.log" | head -n 5 |
		sed "s/^/M=$m hotkeyproxy log: /" >>"$PROBLEMS" || true
	mv "$BENCH_TMP/hotkeyproxy.log" "$BENCH_TMP/hotkeyproxy-M$m.log"
	for ((i = m - 1; i >= 0; i--)); do
		bench_stop "${CLUSTER_PIDS[i]}"
		mv "$BENCH_TMP/cluster-$i" "$BENCH_TMP/M$m-cluster-$i"
	done
}

START=$SECONDS
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
for m in "${MASTERS_ARR[@]}"; do run_size "$m"; done
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

# Best round per (M, cell); ratios against the same M's direct cell (the
# sold-out cells against soldout-direct) and against the same cell at the
# first M.
table=$(awk -F'\t' -v first="${MASTERS_ARR[0]}" '
	{
		k = $1 SUBSEP $2
		if (!(k in best) || $4 + 0 > best[k] + 0) { best[k] = $4; row[k] = $0 }
		if (!($1 in seenm)) { seenm[$1] = 1; ms[++nm] = $1 }
	}
	END {
		nc = split("direct proxy-plain proxy-hot soldout-direct soldout-proxy ping-proxy", cells, " ")
		print "| masters | cell | ops/s | vs direct | vs " first " master(s) | per master | proxy CPU % of a core | proxy µs/req | busiest master CPU % | its periods throttled | other CPU % | latency ms | oversell / false sold-outs / errors |"
		print "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
		for (i = 1; i <= nm; i++) for (c = 1; c <= nc; c++) {
			m = ms[i]; k = m SUBSEP cells[c]
			if (!(k in row)) continue
			split(row[k], f, "\t")
			ref = cells[c] ~ /^soldout/ ? "soldout-direct" : "direct"
			d = m SUBSEP ref
			vs = (cells[c] != ref && cells[c] != "ping-proxy" && (d in best) && best[d] > 0) ? sprintf("%.2f×", best[k] / best[d]) : "–"
			f1 = first SUBSEP cells[c]
			v1 = (m != first && (f1 in best) && best[f1] > 0) ? sprintf("%.2f×", best[k] / best[f1]) : "–"
			per = cells[c] == "proxy-hot" ? sprintf("%.0f", best[k] / m) : "–"
			chk = f[13] == "-" ? "–" : f[13] " / " f[14] " / " f[15]
			printf "| %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s%% | %s | %s | %s |\n", m, cells[c], best[k], vs, v1, per,
				f[6], f[7], f[8], f[9], f[10], f[11], chk
		}
	}' "$RAW")

cpu_model=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
commit=$(git -C "$BENCH_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n $(git -C "$BENCH_ROOT" status --porcelain 2>/dev/null) ]]; then commit="$commit (with uncommitted changes)"; fi
report=$(
	echo "# hotkeyproxy hot-key scale-out benchmark, $(date '+%Y-%m-%d %H:%M:%S %Z')"
	echo
	echo "Redis Clusters of ${MASTERS_ARR[*]} masters (no replicas), one after the other, each master held to" \
		"${QUOTA_PCT}% of one core by a cgroup $BENCH_CG_KIND CPU quota (period ${BENCH_CG_PERIOD} µs), standing in for one machine per master;" \
		"$(if [[ $PIN != none ]]; then echo "the masters on CPU $PIN; the proxy (GOMAXPROCS $(bench_cpus "$BENCH_REST" | wc -l), as Go sets it from the CPUs it may use), the load generator and redis-benchmark on CPU $BENCH_REST."; else echo "every process on every CPU."; fi)" \
		"$CLIENTS clients per cell, one connection each, depth 1, ${SECS} s per cell, best of $ROUNDS round(s)."
	echo
	echo "- direct / proxy-plain / proxy-hot: \`hotkeyproxy bench seckill\` (deduct-one by EVALSHA) on stock:plain straight to its master," \
		"the same key through hotkeyproxy, and stock:hot, a hot key of 2·M buckets (2 per master), through hotkeyproxy;" \
		"ops/s = units sold ÷ time to the last sale (stock $STOCK, never sold out); latency: p99 of successful deducts."
	echo "- soldout-direct / soldout-proxy: redis-benchmark --threads 2 EVALSHA of the same script on the emptied keys (stock 0)," \
		"straight to the plain key's master and through the proxy on the hot key (answered from its sold-out memory); ping-proxy:" \
		"redis-benchmark -t ping_mbulk against the proxy. Timed runs; ops/s and latency (avg) from redis-benchmark's overall figures."
	echo "- vs direct: against the same M's direct cell (sold-out cells: against soldout-direct). per master: proxy-hot ÷ M." \
		"proxy CPU: user+system of hotkeyproxy's process over the cell (its whole run), % of one core and µs per request." \
		"busiest master: the master with most CPU during the cell, % of one core (its quota: ${QUOTA_PCT}%), and the share of its" \
		"quota periods in which it was throttled — near 100% means Redis was the limit; a low figure with the proxy near 100% of a core" \
		"means the proxy (or the shared cores) was. other CPU %: busy time of the machine (all ${#MINE[@]} CPUs) used by neither the masters," \
		"the proxy nor the load generator: other processes competing."
	if [[ $QUICK == 1 ]]; then echo "- BENCH_QUICK=1: smoke run, numbers are rough."; fi
	echo
	echo "$table"
	echo
	echo "- machine: ${#MINE[@]} CPUs, $cpu_model, Linux $(uname -r); load average $LOAD0 at the start, $LOAD1 at the end ($((SECONDS - START)) s)"
	echo "- $(redis-server --version | cut -d' ' -f1-3), $(go version | sed 's/^go version //'), hotkeyproxy $commit (default config, upstream.mode cluster)"
	if [[ $PIN != none ]]; then
		echo "- the load generator and the proxy are not limited by a quota; they share CPU $BENCH_REST with each other, and the masters share CPU $PIN"
	else
		echo "- the load generator and the proxy are not limited; they share the machine's cores with each other and with the masters"
	fi
	bench_problems "$PROBLEMS"
)
bench_save_report scale "$report"
if grep -qv -e 'hotkeyproxy log:' "$PROBLEMS"; then
	exit 1
fi
