#!/usr/bin/env bash
# The proxy's CPU per deduct: redis-benchmark sends the deduct-one script of
# proxy.yaml by EVALSHA (50 clients, depth 1) through hotkeyproxy, on a hot
# key of 8 buckets and on a plain key, in front of one Redis and of a Redis
# Cluster of 3 masters; in cluster mode also on 1,000 plain keys, which
# spread over every master as the hot key's buckets do. The CPU counted is
# the proxy process's own (/proc), not the clients' or Redis's.
#
#   bench/deduct.sh                 full run (about 3 minutes)
#   BENCH_QUICK=1 bench/deduct.sh   smoke run (under a minute)
#
# Environment:
#   BENCH_N           deducts per run (default 200000; quick 20000)
#   BENCH_ROUNDS      interleaved rounds; medians are reported (default 3;
#                     quick 1)
#   BENCH_CLIENTS     redis-benchmark -c (default 50)
#   BENCH_PROXY_CPUS  CPUs (a taskset list) the proxies run on, apart from
#                     Redis and redis-benchmark (default 0 when this script
#                     may use two CPUs or more; "" to share them all)
#   BASELINE_BIN      another hotkeyproxy binary, measured the same way in
#                     the same rounds (named "baseline" in the table)
#   HOTKEYPROXY_BIN   use this binary instead of building one
#   BENCH_KEEP=1      keep the temp dir (logs, raw TSV)
#
# After the runs, the hot key must hold exactly its start value less the
# deducts sent to it through the proxies of each mode, one unit each (the
# binaries' proxies share one Redis, and one cluster): else the script fails.
# Every process it starts listens on 127.0.0.1 on a free port and is
# stopped when the script exits. The table is printed and written to
# bench/results/deduct-<date>.md.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ ${BENCH_QUICK:-0} == 1 ]]; then
	N=${BENCH_N:-20000} ROUNDS=${BENCH_ROUNDS:-1}
else
	N=${BENCH_N:-200000} ROUNDS=${BENCH_ROUNDS:-3}
fi
CLIENTS=${BENCH_CLIENTS:-50}
WARM=$((N / 10))
STOCK=1000000000000
BODY="if tonumber(redis.call('get', KEYS[1]) or '0') > 0 then return redis.call('decr', KEYS[1]) else return -1 end"
CONFIG=(
	'hotkeys: {keys: [{match: "stock:hot", buckets: 8}]}'
	"scripts: [{name: deduct-one, amount: 1, soldout: -1, body: \"$BODY\"}]"
)

for tool in go redis-server redis-benchmark redis-cli ss taskset; do
	command -v "$tool" >/dev/null || bench_die "$tool not found"
done

bench_init
if [[ -z ${BENCH_PROXY_CPUS+set} ]] && (($(bench_own_cpus | wc -l) >= 2)); then
	BENCH_PROXY_CPUS=0
fi
if [[ -n ${BENCH_PROXY_CPUS:-} ]]; then bench_pin_init "$BENCH_PROXY_CPUS"; fi
bench_build_proxy
BINS=(hotkeyproxy)
declare -A BIN_OF=([hotkeyproxy]=$HKP_BIN)
if [[ -n ${BASELINE_BIN:-} ]]; then
	BINS+=(baseline)
	BIN_OF[baseline]=$BASELINE_BIN
fi
bench_start_redis
bench_start_cluster 3

# One proxy per binary and mode: PORT_OF and PID_OF by "binary mode".
declare -A PORT_OF PID_OF SENT
for bin in "${BINS[@]}"; do
	HKP_BIN=${BIN_OF[$bin]}
	PROXY_NAME=$bin-standalone bench_start_proxy "$REDIS_PORT" "${CONFIG[@]}"
	PORT_OF[$bin standalone]=$PROXY_PORT PID_OF[$bin standalone]=$PROXY_PID
	PROXY_NAME=$bin-cluster bench_start_proxy "$CLUSTER_SEEDS" 'upstream: {mode: cluster}' "${CONFIG[@]}"
	PORT_OF[$bin cluster]=$PROXY_PORT PID_OF[$bin cluster]=$PROXY_PID
done
for k in "${!PORT_OF[@]}"; do
	if [[ -n $BENCH_PIN ]]; then bench_pin "${PID_OF[$k]}"; fi
	port=${PORT_OF[$k]}
	SHA=$(redis-cli -p "$port" script load "$BODY")
	if [[ $k == hotkeyproxy* ]]; then
		for key in stock:hot stock:plain; do
			[[ $(redis-cli -p "$port" set "$key" "$STOCK") == OK ]] || bench_die "$k: SET $key failed"
		done
		redis-benchmark -p "$port" -c 10 -n 20000 -r 1000 -q set stock:plain:__rand_int__ "$STOCK" >/dev/null 2>&1
	fi
	SENT[$k]=0
done
bench_log "proxies on CPUs ${BENCH_PIN:-shared}; Redis :$REDIS_PORT, cluster $CLUSTER_SEEDS"

RAW=$BENCH_TMP/raw.tsv # mode key binary round rps us
: >"$RAW"

# run BINARY MODE KEY ROUND: one measured run, after a warm-up.
run() {
	local k="$1 $2" key=$3 port pid t0 t1 n0 n1 out rps use
	port=${PORT_OF[$k]} pid=${PID_OF[$k]}
	redis-benchmark -p "$port" -c "$CLIENTS" -n "$WARM" -r 1000 -q evalsha "$SHA" 1 "$key" >/dev/null 2>&1
	t0=$(bench_cpu_ticks "$pid") n0=$(date +%s%N)
	out=$(redis-benchmark -p "$port" -c "$CLIENTS" -n "$N" -r 1000 evalsha "$SHA" 1 "$key" 2>&1) ||
		bench_die "$k $key: redis-benchmark failed: $(tail -3 <<<"$out")"
	t1=$(bench_cpu_ticks "$pid") n1=$(date +%s%N)
	rps=$(awk '/throughput summary/ {print $3}' <<<"$out")
	[[ -n $rps ]] || bench_die "$k $key: no throughput in redis-benchmark's output"
	use=$(bench_cpu_use "$t0" "$t1" "$n0" "$n1" "$N")
	printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$2" "$key" "$1" "$4" "$rps" "${use#* }" >>"$RAW"
	if [[ $key == stock:hot ]]; then SENT[$k]=$((SENT[$k] + WARM + N)); fi
}

CELLS=()
for bin in "${BINS[@]}"; do
	CELLS+=("$bin standalone stock:plain" "$bin standalone stock:hot")
	CELLS+=("$bin cluster stock:plain" "$bin cluster stock:plain:__rand_int__" "$bin cluster stock:hot")
done
for ((round = 1; round <= ROUNDS; round++)); do
	bench_log "round $round/$ROUNDS (n=$N)"
	for ((i = 0; i < ${#CELLS[@]}; i++)); do
		# shellcheck disable=SC2086 # a cell is three words
		run ${CELLS[(i + round - 1) % ${#CELLS[@]}]} "$round"
	done
done

for mode in standalone cluster; do
	sent=0
	for bin in "${BINS[@]}"; do sent=$((sent + SENT[$bin $mode])); done
	got=$(redis-cli -p "${PORT_OF[hotkeyproxy $mode]}" get stock:hot)
	[[ $got == "$((STOCK - sent))" ]] || bench_die "$mode: stock:hot is $got after $sent deducts of one unit, want $((STOCK - sent))"
done

# median COLUMN MODE KEY BINARY: the median of a column of RAW over a
# cell's runs.
median() {
	awk -F'\t' -v c="$1" -v m="$2" -v k="$3" -v b="$4" '$1 == m && $2 == k && $3 == b {print $c}' "$RAW" |
		sort -n | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

TABLE="| mode | key | proxy | deducts/s | rps min–max (runs) | proxy CPU µs/deduct | vs plain key |
|---|---|---|---:|---|---:|---:|"
for cell in "${CELLS[@]}"; do
	read -r bin mode key <<<"$cell"
	us=$(median 6 "$mode" "$key" "$bin")
	base=$(median 6 "$mode" stock:plain "$bin")
	spread=$(awk -F'\t' -v m="$mode" -v k="$key" -v b="$bin" '$1 == m && $2 == k && $3 == b {print $5}' "$RAW" |
		sort -n | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%.0f–%.0f (%d)", lo, hi, NR}')
	name=$key
	[[ $key != *__rand_int__ ]] || name="1,000 plain keys"
	TABLE+=$'\n'$(awk -v m="$mode" -v k="$name" -v b="$bin" -v rps="$(median 5 "$mode" "$key" "$bin")" -v s="$spread" -v us="$us" -v base="$base" \
		'BEGIN {printf "| %s | %s | %s | %.0f | %s | %.2f | %.2f× |", m, k, b, rps, s, us, us / base}')
done
HEAD="Deducts by EVALSHA of deduct-one, $CLIENTS clients at depth 1, $N a run, rounds: $ROUNDS (interleaved, medians); proxies on CPUs ${BENCH_PIN:-shared with Redis and the client}. $(date -u '+%Y-%m-%d %H:%M UTC'), $(getconf _NPROCESSORS_ONLN) CPUs $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), $(go version | awk '{print $3}'), $(git -C "$BENCH_ROOT" rev-parse --short HEAD)."
bench_save_report deduct "$HEAD

$TABLE"
