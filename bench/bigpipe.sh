#!/usr/bin/env bash
# Huge-pipeline memory: the peak resident memory (VmHWM) of hotkeyproxy and
# of redis-server when one client writes a whole pipeline of hundreds of
# MiB before reading any reply (bench/bigpipe), then reads and checks all
# of them.
#
#   bench/bigpipe.sh                  600 MiB pipelines
#   BENCH_QUICK=1 bench/bigpipe.sh    60 MiB
#
# Shapes (see bench/bigpipe): set (SETs of 1 KiB values adding up to the
# size: the requests are big), get (GETs of a 1 KiB value whose replies add
# up to the size), getbig (the same with a 1 MiB value), mset (one MSET of
# 1 KiB values, two thirds of the size: one command held whole).
#
# Environment:
#   BIGPIPE_SIZE      pipeline size (default 600mb; quick 60mb)
#   BIGPIPE_SHAPES    which shapes, in order (default "set get getbig mset")
#   BIGPIPE_PROXY     extra YAML for the proxy's config, e.g.
#                     'limits: {max_pending_output: 0}'
#   HOTKEYPROXY_BIN, BENCH_KEEP=1   as in passthrough.sh
#
# Each run has fresh processes, so each peak is that run's: Redis alone
# (direct), then Redis behind hotkeyproxy (the proxy's peak, and Redis's).
# Everything listens on 127.0.0.1, free ports; stopped on exit.
set -euo pipefail

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ ${BENCH_QUICK:-0} == 1 ]]; then SIZE=${BIGPIPE_SIZE:-60mb}; else SIZE=${BIGPIPE_SIZE:-600mb}; fi
read -r -a SHAPES <<<"${BIGPIPE_SHAPES:-set get getbig mset}"

for tool in go redis-server redis-cli ss timeout; do
	command -v "$tool" >/dev/null || bench_die "$tool not found"
done

bench_init
bench_build_proxy
bench_log "building bigpipe"
(cd "$BENCH_ROOT" && go build -o "$BENCH_TMP/bigpipe" ./bench/bigpipe) || bench_die "go build bigpipe failed"

hwm_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status"; }
mib() { awk -v k="$1" 'BEGIN {printf "%.0f", k / 1024}'; }

# shape_args SHAPE: bigpipe's arguments for a shape.
shape_args() {
	local n=${SIZE%[kmgKMG][bB]} unit=${SIZE##*[0-9]}
	case $1 in
	set) echo "-shape set -size $SIZE -value 1kb" ;;
	get) echo "-shape get -size $SIZE -value 1kb" ;;
	getbig) echo "-shape get -size $SIZE -value 1mb" ;;
	mset) echo "-shape mset -size $((n * 2 / 3))$unit -value 1kb" ;;
	*) bench_die "unknown shape $1" ;;
	esac
}

rows=()
for shape in "${SHAPES[@]}"; do
	read -r -a args <<<"$(shape_args "$shape")"
	# shellcheck disable=SC2119 # no extra redis-server arguments
	bench_start_redis
	out=$("$BENCH_TMP/bigpipe" -addr "127.0.0.1:$REDIS_PORT" "${args[@]}") || bench_die "$shape direct: $out"
	direct=$(hwm_kib "$REDIS_PID")
	bench_log "$shape direct: $out; redis peak $(mib "$direct") MiB"
	bench_stop "$REDIS_PID"

	bench_start_redis
	bench_start_proxy "$REDIS_PORT" "${BIGPIPE_PROXY:-}"
	out=$("$BENCH_TMP/bigpipe" -addr "127.0.0.1:$PROXY_PORT" "${args[@]}") || bench_die "$shape via proxy: $out"
	proxy=$(hwm_kib "$PROXY_PID") behind=$(hwm_kib "$REDIS_PID")
	bench_log "$shape via proxy: $out; proxy peak $(mib "$proxy") MiB, redis behind it $(mib "$behind") MiB"
	bench_stop "$PROXY_PID"
	bench_stop "$REDIS_PID"
	rows+=("| $shape | ${args[*]} | $(mib "$direct") | $(mib "$proxy") | $(awk -v p="$proxy" -v d="$direct" 'BEGIN {printf "%.2f", p / d}') | $(mib "$behind") | ${out#*: } |")
done

bench_save_report bigpipe "$(
	echo "# Huge-pipeline memory, $(date '+%Y-%m-%d %H:%M:%S %Z')"
	echo
	echo "One client writes the whole pipeline, then reads every reply. Peak RSS (VmHWM) in MiB, fresh processes per run."
	echo
	echo "| shape | bigpipe | redis direct | hotkeyproxy | proxy ÷ redis | redis behind the proxy | via the proxy |"
	echo "|---|---|---:|---:|---:|---:|---|"
	printf '%s\n' "${rows[@]}"
	echo
	echo "- machine: $(nproc) CPUs, $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo), Linux $(uname -r); $(go version | sed 's/^go version //')"
	echo "- hotkeyproxy $(git -C "$BENCH_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)${BIGPIPE_PROXY:+, proxy config: $BIGPIPE_PROXY}; redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')"
)"
