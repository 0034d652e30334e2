#!/usr/bin/env bash
# Hot-key detection: what it costs and how fast it finds a key.
#
# 1. Throughput: redis-benchmark SET/GET over 100,000 random keys through
#    two hotkeyproxy instances on one Redis, one with the detector on
#    (sample_rate 0.01, window 1s, threshold 5000), one with it off;
#    interleaved rounds, medians.
# 2. Detection latency: one key goes from idle to full speed (INCR,
#    pipelined, far above the threshold) through the proxy with the
#    detector on; the time from the first request to PROXY HOTKEYS DETECTED
#    reporting it hot, polled every 10 ms.
#
#   bench/detect.sh                 full run (~2 minutes)
#   BENCH_QUICK=1 bench/detect.sh   smoke run (~20 s)
#
# BENCH_LOAD_CLIENTS and BENCH_LOAD_DEPTH set the hot key's load (default
# 30 clients at depth 1: about 50,000 ops/s on the 2-core machine of the
# README; the rate reached is reported).
# Environment: BENCH_N (requests per throughput run, default 1000000; quick
# 200000), BENCH_ROUNDS (default 3; quick 1), BENCH_DEPTH (redis-benchmark
# -P, default 16), BENCH_CLIENTS (default 50), HOTKEYPROXY_BIN, BENCH_KEEP.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

QUICK=${BENCH_QUICK:-0}
N=${BENCH_N:-$([[ $QUICK == 1 ]] && echo 200000 || echo 1000000)}
ROUNDS=${BENCH_ROUNDS:-$([[ $QUICK == 1 ]] && echo 1 || echo 3)}
DEPTH=${BENCH_DEPTH:-16}
CLIENTS=${BENCH_CLIENTS:-50}
# The hot key's load: depth 1 and 30 clients make about 50,000 INCR/s here.
LOAD_CLIENTS=${BENCH_LOAD_CLIENTS:-30}
LOAD_DEPTH=${BENCH_LOAD_DEPTH:-1}

bench_init
bench_build_proxy
bench_start_redis
bench_start_proxy "$REDIS_PORT"
OFF_PORT=$PROXY_PORT
bench_start_proxy "$REDIS_PORT" \
	'hotkeys: {detect: {enabled: true, sample_rate: 0.01, window: 1s, threshold: 5000, capacity: 10000}}'
ON_PORT=$PROXY_PORT

rps() { # PORT TEST: requests/s of one redis-benchmark run
	redis-benchmark -h 127.0.0.1 -p "$1" -c "$CLIENTS" -n "$N" -r 100000 -P "$DEPTH" -t "$2" --csv |
		tail -1 | tr -d '"' | cut -d, -f2
}
RAW=$BENCH_TMP/detect.tsv
: >"$RAW"
targets=(off on)
for ((round = 1; round <= ROUNDS; round++)); do
	for test in set get; do
		for ((k = 0; k < 2; k++)); do
			t=${targets[(k + round) % 2]}
			port=$OFF_PORT
			[[ $t == on ]] && port=$ON_PORT
			r=$(rps "$port" "$test")
			bench_log "round $round $test detector $t: $r rps"
			printf '%s\t%s\t%s\n' "$t" "$test" "$r" >>"$RAW"
		done
	done
done

# Detection latency.
start_ns=$(date +%s%N)
redis-benchmark -h 127.0.0.1 -p "$ON_PORT" -c "$LOAD_CLIENTS" -n 100000000 -P "$LOAD_DEPTH" incr hot:detect >/dev/null 2>&1 &
LOAD_PID=$!
bench_track redis-benchmark "$BENCH_TMP/load.log" "$LOAD_PID"
found=""
while (($(date +%s%N) - start_ns < 10000000000)); do
	if redis-cli -p "$ON_PORT" proxy hotkeys detected 1 | tr '\n' ' ' | grep -q 'key hot:detect .* hot yes'; then
		found=$(($(date +%s%N) - start_ns))
		break
	fi
	sleep 0.01
done
c0=$(redis-cli -p "$REDIS_PORT" get hot:detect)
sleep 1
c1=$(redis-cli -p "$REDIS_PORT" get hot:detect)
bench_stop "$LOAD_PID"
detected=$(redis-cli -p "$ON_PORT" proxy hotkeys detected 1 | tr '\n' ' ')

table=$(awk -F'\t' '
	function median(s,   a, k, i, j, t) {
		k = split(s, a, " ")
		for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return a[int((k + 1) / 2)]
	}
	{ v[$1 "," $2] = v[$1 "," $2] " " $3 }
	END {
		print "| | detector off rps | detector on rps | on ÷ off |"
		print "|---|---:|---:|---:|"
		split("set get", t, " ")
		for (i = 1; i <= 2; i++) {
			off = median(v["off," t[i]]); on = median(v["on," t[i]])
			printf "| %s | %.0f | %.0f | %.3f |\n", toupper(t[i]), off, on, on / off
		}
	}' "$RAW")

report=$(
	echo "# hotkeyproxy detection benchmark, $(date '+%Y-%m-%d %H:%M:%S %Z')"
	echo
	echo "redis-benchmark -c $CLIENTS -P $DEPTH -r 100000 -n $N, SET and GET, through two hotkeyproxy instances on one redis-server," \
		"the detector off and on (sample_rate 0.01, window 1s, threshold 5000 ops/s); median of $ROUNDS interleaved round(s)."
	if [[ $QUICK == 1 ]]; then echo "BENCH_QUICK=1: smoke run, numbers are rough."; fi
	echo
	echo "$table"
	echo
	if [[ -n $found ]]; then
		echo "- detection latency: INCR hot:detect from idle to ~$((c1 - c0)) ops/s (redis-benchmark -c $LOAD_CLIENTS -P $LOAD_DEPTH):" \
			"reported hot by PROXY HOTKEYS DETECTED $((found / 1000000)) ms after the load started (polled every 10 ms; the window is 1000 ms)"
	else
		echo "- detection latency: hot:detect was NOT reported within 10 s (load ~$((c1 - c0)) ops/s)"
	fi
	echo "- PROXY HOTKEYS DETECTED 1 at the end: $detected"
	echo "- machine: $(nproc) CPUs, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo); redis-server, both proxies and redis-benchmark share them"
	echo "- $(redis-server --version | cut -d' ' -f1-3), $(go version | sed 's/^go version //'), hotkeyproxy $(cd "$BENCH_ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
)
bench_save_report detect "$report"
