#!/usr/bin/env bash
# Flash sale over a Redis Cluster of 3 masters: one stock key sold out by
# 200 clients running the deduct-one script (EVALSHA), in one run:
#
#   direct       the script on a plain key, straight to the master owning it
#   proxy-plain  the same plain key through hotkeyproxy (a relay)
#   proxy-hot    a hot key of 8 buckets through hotkeyproxy
#   proxy-journal  the hot key with journal: true (a stream entry per
#                deduct, in the same Lua step), the journal checked against
#                the units sold at the end (bench seckill --journal)
#   proxy-journal-ids  the same with an order id per deduct, checked entry
#                for entry (--journal --order-ids)
#
# then, once sold out, the request rate of the same EVALSHA on the sold-out
# key (redis-benchmark), straight to Redis and through the proxy, where the
# proxy answers "sold out" from memory.
#
#   bench/seckill.sh                 full run (~2 minutes)
#   BENCH_QUICK=1 bench/seckill.sh   smoke run (~30 s)
#
# Environment:
#   BENCH_STOCK     units per sale (default 100000; quick 20000)
#   BENCH_CLIENTS   concurrent buyers (default 200)
#   BENCH_BUCKETS   buckets of the hot key (default 8)
#   BENCH_ROUNDS    interleaved rounds of the three sales; medians are
#                   reported (default 3; quick 1)
#   BENCH_AFTER_N   requests per after-sell-out run (default 1000000;
#                   quick 200000)
#   HOTKEYPROXY_BIN use this binary instead of building one
#   BENCH_KEEP=1    keep the temp dir (logs, JSON results)
#
# Upstream commands per deduct come from the proxy's own count for the key
# (PROXY HOTKEYS upstream_calls: every command it sent for the key, the
# SET that splits the stock and each read of the buckets included). Each
# master's share is of the scripts the masters ran (INFO commandstats
# evalsha + eval, reset before each sale): commands a script runs inside
# count there too, so they cannot be summed as they are.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

QUICK=${BENCH_QUICK:-0}
STOCK=${BENCH_STOCK:-$([[ $QUICK == 1 ]] && echo 20000 || echo 100000)}
CLIENTS=${BENCH_CLIENTS:-200}
BUCKETS=${BENCH_BUCKETS:-8}
ROUNDS=${BENCH_ROUNDS:-$([[ $QUICK == 1 ]] && echo 1 || echo 3)}
AFTER_N=${BENCH_AFTER_N:-$([[ $QUICK == 1 ]] && echo 200000 || echo 1000000)}
MASTERS=3
command -v jq >/dev/null || bench_die "jq is needed (apt-get install jq)"

bench_init
bench_build_proxy
bench_log "starting a cluster of $MASTERS masters"
bench_start_cluster "$MASTERS"
scripts=$(sed -n '/^scripts:/,/^metrics:/{/^metrics:/d;p}' "$BENCH_ROOT/proxy.yaml")
bench_start_proxy "$CLUSTER_SEEDS" 'upstream: {mode: cluster}' \
	"hotkeys: {keys: [{match: stock:hot, buckets: $BUCKETS}, {match: stock:journal, buckets: $BUCKETS, journal: true}]}" "$scripts"

# master_port KEY: the port of the master owning KEY's slot (master i holds
# the i-th contiguous share of the slots).
master_port() {
	local slot
	slot=$(redis-cli -p "${CLUSTER_PORTS[0]}" cluster keyslot "$1")
	echo "${CLUSTER_PORTS[slot * MASTERS / 16384]}"
}
PLAIN_PORT=$(master_port stock:plain)
SHA=$(redis-cli -p "$PROXY_PORT" script load "$(sed -n "s/^    body: \"\(if tonumber.*\)\"$/\1/p" "$BENCH_ROOT/proxy.yaml")")

# calls PORT: the scripts a master has run since CONFIG RESETSTAT.
calls() {
	redis-cli -p "$1" info commandstats | tr -d '\r' |
		awk -F'[:=,]' '$1 == "cmdstat_evalsha" || $1 == "cmdstat_eval" {n += $3} END {print n + 0}'
}

# counter KEY NAME: the proxy's counter NAME for the hot key KEY (0 before
# it met it).
counter() {
	redis-cli -p "$PROXY_PORT" proxy hotkeys |
		awk -v k="$1" -v n="$2" 'p && $0 == n {getline; v = $0; exit} prev == "key" {p = ($0 == k)} {prev = $0} END {print v + 0}'
}

RAW=$BENCH_TMP/sales.tsv
: >"$RAW"
sale() {
	local target=$1 round=$2 addr=127.0.0.1:$PROXY_PORT key=stock:plain port out flags=()
	case $target in
	direct) addr=127.0.0.1:$PLAIN_PORT ;;
	proxy-hot) key=stock:hot ;;
	proxy-journal) key=stock:journal flags=(--journal) ;;
	proxy-journal-ids) key=stock:journal flags=(--journal --order-ids) ;;
	esac
	for port in "${CLUSTER_PORTS[@]}"; do redis-cli -p "$port" config resetstat >/dev/null; done
	out=$BENCH_TMP/$target-$round.json
	local up0 up1
	up0=$(counter "$key" upstream_calls)
	"$HKP_BIN" bench seckill --addr "$addr" --key "$key" --stock "$STOCK" --clients "$CLIENTS" "${flags[@]}" --json >"$out" ||
		bench_log "$target round $round: violations or errors (see $out)"
	up1=$(counter "$key" upstream_calls)
	local per=()
	for port in "${CLUSTER_PORTS[@]}"; do per+=("$(calls "$port")"); done
	jq -r --arg t "$target" --arg per "${per[*]}" --arg up $((up1 - up0)) \
		'[$t, .units_per_sec, .sold, .ok, .sold_out, .errors, .oversell, .false_sold_outs, .latency.ok.p50_ns, .latency.ok.p99_ns, $per, $up,
		  (if .journal == null then "-" elif (.journal.deducted - .journal.given_back == .sold and .journal.no_entry == 0 and .journal.no_success == 0 and (.journal.error // "") == "") then "ok" else "FAIL" end)] | @tsv' \
		"$out" >>"$RAW"
	bench_log "$target round $round: $(jq -r '"\(.units_per_sec|floor) units/s, sold \(.sold), errors \(.errors)"' "$out"); scripts per master ${per[*]}; proxy upstream calls $((up1 - up0))"
}
TARGETS=(direct proxy-plain proxy-hot proxy-journal proxy-journal-ids)
for ((round = 1; round <= ROUNDS; round++)); do
	for ((k = 0; k < ${#TARGETS[@]}; k++)); do
		sale "${TARGETS[(k + round - 1) % ${#TARGETS[@]}]}" "$round"
	done
done

# After the sell-out: EVALSHA on the sold-out keys at full speed.
after() {
	redis-benchmark -h 127.0.0.1 -p "$1" -c "$CLIENTS" -n "$AFTER_N" -P "$3" --threads 2 --csv \
		evalsha "$SHA" 1 "$2" | tail -1 | tr -d '"' | cut -d, -f2
}
up0=$(counter stock:hot upstream_calls)
AFTER_PROXY=$(after "$PROXY_PORT" stock:hot 1)
AFTER_PROXY16=$(after "$PROXY_PORT" stock:hot 16)
AFTER_PROXY_CALLS=$(($(counter stock:hot upstream_calls) - up0))
AFTER_DIRECT=$(after "$PLAIN_PORT" stock:plain 1)
AFTER_DIRECT16=$(after "$PLAIN_PORT" stock:plain 16)

table=$(awk -F'\t' -v n="$ROUNDS" -v m="$MASTERS" -v ap="$AFTER_PROXY" -v ad="$AFTER_DIRECT" -v apc="$AFTER_PROXY_CALLS" -v an="$AFTER_N" \
	-v ap16="$AFTER_PROXY16" -v ad16="$AFTER_DIRECT16" '
	function median(s,   a, k, i, j, t) {
		k = split(s, a, " ")
		for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return a[int((k + 1) / 2)]
	}
	{
		ups[$1] = ups[$1] " " $2; p50[$1] = p50[$1] " " $9; p99[$1] = p99[$1] " " $10
		sold[$1] += $3; over[$1] += $7; fso[$1] += $8; errs[$1] += $6
		if ($13 != "-") { jrounds++; if ($13 == "ok") jok++ }
		if ($1 == "proxy-hot") {
			k = split($11, c, " ")
			for (i = 1; i <= k; i++) { per[i] += c[i]; all += c[i] }
			cpd = cpd " " $12 / ($4 + $5)
			cps = cps " " $12 / $4
		}
	}
	END {
		print "| | units/s | vs direct | p50 ms | p99 ms | oversell | false sold-outs | errors |"
		print "|---|---:|---:|---:|---:|---:|---:|---:|"
		d = median(ups["direct"])
		split("direct proxy-plain proxy-hot proxy-journal proxy-journal-ids", order, " ")
		for (o = 1; o <= 5; o++) {
			t = order[o]
			printf "| %s | %.0f | %.2f× | %.2f | %.2f | %d | %d | %d |\n", t, median(ups[t]), median(ups[t]) / d,
				median(p50[t]) / 1e6, median(p99[t]) / 1e6, over[t], fso[t], errs[t]
		}
		print ""
		printf "- proxy-journal and proxy-journal-ids: the journal deducted exactly the units sold (entry for entry by order id with ids) in %d of %d sales\n", jok, jrounds
		printf "- upstream commands per deduct, hot key, whole sale (the SET and every read included): %.3f per deduct request, %.3f per unit sold (median of rounds)\n", median(cpd), median(cps)
		printf "- share of the hot key'"'"'s scripts per master (1/%d = %.1f%%):", m, 100 / m
		for (i = 1; i <= m; i++) printf " %.1f%% (%+.0f%%)", 100 * per[i] / all, 100 * (per[i] / all * m - 1)
		print ""
		printf "- after the sell-out, EVALSHA on the sold-out key, %d clients, depth 1: direct %.0f req/s, through the proxy %.0f req/s (%.2f×)\n", n_clients, ad, ap, ap / ad
		printf "- the same at depth 16: direct %.0f req/s, through the proxy %.0f req/s (%.2f×); upstream commands during the proxy'"'"'s %d + %d requests: %d\n", ad16, ap16, ap16 / ad16, an, an, apc
	}' n_clients="$CLIENTS" "$RAW")

report=$(
	echo "# hotkeyproxy flash-sale benchmark, $(date '+%Y-%m-%d %H:%M:%S %Z')"
	echo
	echo "A Redis Cluster of $MASTERS masters (no replicas); $CLIENTS clients (\`hotkeyproxy bench seckill\`, one connection each," \
		"depth 1) sell out $STOCK units with the deduct-one script by EVALSHA; median of $ROUNDS interleaved round(s)." \
		"units/s = units sold ÷ time to the last sale; latencies are of successful deducts."
	echo "direct: the plain key stock:plain on its master (:$PLAIN_PORT); proxy-plain: the same key through hotkeyproxy;" \
		"proxy-hot: stock:hot, a hot key of $BUCKETS buckets, through hotkeyproxy;" \
		"proxy-journal: stock:journal, the same with journal: true, the journal checked at the end;" \
		"proxy-journal-ids: the same with an order id per deduct (ARGV[1]), checked entry for entry."
	if [[ $QUICK == 1 ]]; then echo "BENCH_QUICK=1: smoke run, numbers are rough."; fi
	echo
	echo "$table"
	echo
	echo "- machine: $(nproc) CPUs, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), Linux $(uname -r);" \
		"the masters, the proxy and the load generator share them"
	echo "- $(redis-server --version | cut -d' ' -f1-3), $(go version | sed 's/^go version //'), hotkeyproxy $(cd "$BENCH_ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
)
bench_save_report seckill "$report"
