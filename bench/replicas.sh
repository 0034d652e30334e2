#!/usr/bin/env bash
# The cost of wait_replicas on the flash sale: a Redis Cluster of 3 masters
# with a replica each, in sync; one hotkeyproxy with two hot keys of 8
# buckets, sold out in turn by the same clients with the deduct-one script
# (EVALSHA), in one run:
#
#   async   stock:async, wait_replicas 0 (the default: Redis replicates
#           asynchronously, the client is answered at once)
#   acked   stock:acked, wait_replicas 1, wait_timeout 100ms (each deduct
#           is followed by WAIT 1 100 on its master, on the connection
#           that wrote it, before the client is answered)
#
#   bench/replicas.sh                 full run (~1 minute)
#   BENCH_QUICK=1 bench/replicas.sh   smoke run (~20 s)
#
# Environment:
#   BENCH_STOCK     units per sale (default 100000; quick 20000)
#   BENCH_CLIENTS   concurrent buyers (default 200)
#   BENCH_ROUNDS    interleaved rounds; medians are reported (default 3;
#                   quick 1)
#   HOTKEYPROXY_BIN use this binary instead of building one
#   BENCH_KEEP=1    keep the temp dir (logs, JSON results)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

QUICK=${BENCH_QUICK:-0}
STOCK=${BENCH_STOCK:-$([[ $QUICK == 1 ]] && echo 20000 || echo 100000)}
CLIENTS=${BENCH_CLIENTS:-200}
ROUNDS=${BENCH_ROUNDS:-$([[ $QUICK == 1 ]] && echo 1 || echo 3)}
MASTERS=3
command -v jq >/dev/null || bench_die "jq is needed (apt-get install jq)"

bench_init
bench_build_proxy
bench_log "starting a cluster of $MASTERS masters with a replica each"
bench_start_cluster "$MASTERS"
bench_add_replicas
scripts=$(sed -n '/^scripts:/,/^metrics:/{/^metrics:/d;p}' "$BENCH_ROOT/proxy.yaml")
bench_start_proxy "$CLUSTER_SEEDS" 'upstream: {mode: cluster}' \
	'hotkeys: {keys: [{match: stock:async, buckets: 8}, {match: stock:acked, buckets: 8, wait_replicas: 1, wait_timeout: 100ms}]}' \
	"$scripts"

RAW=$BENCH_TMP/sales.tsv
: >"$RAW"
sale() {
	local target=$1 round=$2 out=$BENCH_TMP/$1-$2.json
	"$HKP_BIN" bench seckill --addr "127.0.0.1:$PROXY_PORT" --key "stock:$target" --stock "$STOCK" --clients "$CLIENTS" --json >"$out" ||
		bench_log "$target round $round: violations or errors (see $out)"
	jq -r --arg t "$target" '[$t, .units_per_sec, .sold, .errors, .oversell, .latency.ok.p50_ns, .latency.ok.p99_ns] | @tsv' "$out" >>"$RAW"
	bench_log "$target round $round: $(jq -r '"\(.units_per_sec|floor) units/s, sold \(.sold), errors \(.errors)"' "$out")"
}
TARGETS=(async acked)
for ((round = 1; round <= ROUNDS; round++)); do
	for ((k = 0; k < ${#TARGETS[@]}; k++)); do
		sale "${TARGETS[(k + round - 1) % ${#TARGETS[@]}]}" "$round"
	done
done

table=$(awk -F'\t' '
	function median(s,   a, k, i, j, t) {
		k = split(s, a, " ")
		for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return a[int((k + 1) / 2)]
	}
	{ ups[$1] = ups[$1] " " $2; p50[$1] = p50[$1] " " $6; p99[$1] = p99[$1] " " $7; errs[$1] += $4; over[$1] += $5 }
	END {
		print "| | units/s | vs async | p50 ms | p99 ms | oversell | errors |"
		print "|---|---:|---:|---:|---:|---:|---:|"
		a = median(ups["async"])
		split("async acked", order, " ")
		for (o = 1; o <= 2; o++) {
			t = order[o]
			printf "| %s | %.0f | %.2f× | %.2f | %.2f | %d | %d |\n", t, median(ups[t]), median(ups[t]) / a,
				median(p50[t]) / 1e6, median(p99[t]) / 1e6, over[t], errs[t]
		}
	}' "$RAW")

report=$(
	echo "# hotkeyproxy wait_replicas benchmark, $(date '+%Y-%m-%d %H:%M:%S %Z')"
	echo
	echo "A Redis Cluster of $MASTERS masters with a replica each (in sync before the first sale); $CLIENTS clients" \
		"(\`hotkeyproxy bench seckill\`, one connection each, depth 1) sell out $STOCK units of a hot key of 8 buckets" \
		"with the deduct-one script by EVALSHA, through one hotkeyproxy; median of $ROUNDS interleaved round(s)." \
		"async: wait_replicas 0; acked: wait_replicas 1, wait_timeout 100ms."
	if [[ $QUICK == 1 ]]; then echo "BENCH_QUICK=1: smoke run, numbers are rough."; fi
	echo
	echo "$table"
	echo
	echo "- errors: deducts answered with an error; for acked, those a replica did not acknowledge within 100ms are among them"
	echo "- machine: $(nproc) CPUs, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), Linux $(uname -r);" \
		"the masters, the replicas, the proxy and the load generator share them"
	echo "- $(redis-server --version | cut -d' ' -f1-3), $(go version | sed 's/^go version //'), hotkeyproxy $(cd "$BENCH_ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
)
bench_save_report replicas "$report"
