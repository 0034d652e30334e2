#!/usr/bin/env bash
# Redis's own test suite (the Tcl suite of a Redis 7.0 source tree, in
# external mode) through hotkeyproxy in front of a fresh redis-server, and
# with DIRECT=1 against that redis-server too: tests passed, failed and
# skipped per unit, the totals, and with DIRECT=1 the tests that pass
# directly but not through the proxy.
#
#   bench/redis_suite.sh SRC [UNIT...]     (default: every unit of SRC)
#   make redis-suite SRC=/tmp/redis-7.0.15 [DIRECT=1] [UNITS="unit/type/list unit/scripting"]
#
# SRC is a Redis 7.0 source tree (git archive 7.0.15 of the redis
# repository) holding runtest, tests/ and the binaries src/redis-server,
# src/redis-cli and src/redis-benchmark, which some tests run even in
# external mode: build them (make -C SRC) or link the installed 7.0 ones
# (ln -s /usr/bin/redis-server /usr/bin/redis-cli /usr/bin/redis-benchmark
# SRC/src/). The servers under test are the redis-server on PATH.
#
# Each unit runs alone, on a new redis-server (no persistence; DEBUG,
# protected configs and MODULE allowed, as the suite's own default.conf has
# them) and a new proxy in front of it (default config), as
#   ./runtest --host 127.0.0.1 --port P --single UNIT --durable --timeout T
# --durable counts an exception inside a test as that test's failure and
# goes on; one outside any test, or T seconds without progress, ends the
# unit ("aborted" in the table). The suite runs one test client against an
# external server, so a run takes one core at most.
#
# Environment: DIRECT=1; SUITE_TIMEOUT (T, seconds, default 180); SUITE_OUT
# (where the logs go, default a new directory under /tmp: one log per unit
# and target, and lost.txt); HOTKEYPROXY_BIN (a built proxy); SUITE_REPORT=1
# (run nothing: print the table of the logs in SUITE_OUT).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SRC=${1:?usage: bench/redis_suite.sh SRC [UNIT...]}
shift
SRC=$(cd "$SRC" && pwd)
for f in runtest tests/test_helper.tcl src/redis-server src/redis-cli src/redis-benchmark; do
	[[ -e $SRC/$f ]] || bench_die "$SRC/$f missing: SRC must be a Redis 7.0 source tree with its binaries (see the top of $0)"
done
TIMEOUT=${SUITE_TIMEOUT:-180}
OUT=${SUITE_OUT:-$(mktemp -d /tmp/redis-suite.XXXXXX)}
mkdir -p "$OUT"
UNITS=("$@")
if ((${#UNITS[@]} == 0)); then
	# The list runtest itself walks: set ::all_tests { ... }.
	mapfile -t UNITS < <(awk '/^set ::all_tests \{/ {on = 1; next} on && /^\}/ {exit} on && NF {print $1}' \
		"$SRC/tests/test_helper.tcl")
fi
TARGETS=(proxy)
[[ ${DIRECT:-0} == 1 ]] && TARGETS=(direct proxy)

bench_init
[[ ${SUITE_REPORT:-0} == 1 ]] || bench_build_proxy

# run_unit TARGET UNIT: one runtest of UNIT against a new redis-server,
# directly or through a new proxy; the log goes to $OUT/TARGET/UNIT.log.
run_unit() {
	local target=$1 unit=$2 port log=$OUT/$1/$2.log
	mkdir -p "$(dirname "$log")"
	bench_start_redis --enable-debug-command yes --enable-protected-configs yes --enable-module-command yes
	port=$REDIS_PORT
	if [[ $target == proxy ]]; then
		bench_start_proxy "$REDIS_PORT"
		port=$PROXY_PORT
	fi
	# The test server listens on the first free port of the 32 below
	# --baseport: start at a free one, so that runs side by side do not
	# collide.
	(cd "$SRC" && ./runtest --host 127.0.0.1 --port "$port" --single "$unit" --durable \
		--timeout "$TIMEOUT" --baseport $(($(bench_free_port "$port") + 32)) </dev/null >"$log" 2>&1) || true
	if [[ $target == proxy ]]; then
		mv "$BENCH_TMP/hotkeyproxy.log" "${log%.log}.proxy.log"
		bench_stop "$PROXY_PID"
	fi
	bench_stop "$REDIS_PID"
	mv "$BENCH_TMP/redis.log" "${log%.log}.redis.log"
}

# counts LOG: "passed failed skipped aborted" of one unit's log; aborted is
# 1 when the unit did not run to its end.
counts() {
	sed 's/\x1b\[[0-9;]*m//g' "$1" | awk '
		/^\[ok\]: / {ok++} /^\[err\]: / {err++} /^\[(skip|ignore)\]: / {skip++}
		/^\[exception\]: |\[TIMEOUT\]/ {bad = 1} /^\[[0-9]+\/[0-9]+ done\]: / {done = 1}
		END {print ok + 0, err + 0, skip + 0, (bad || !done) ? 1 : 0}'
}

# passed LOG: the names of the tests that passed, sorted (a name may repeat).
passed() {
	sed 's/\x1b\[[0-9;]*m//g' "$1" | sed -n 's/^\[ok\]: \(.*\) ([0-9]* ms)$/\1/p' | LC_ALL=C sort
}

for unit in "${UNITS[@]}"; do
	[[ ${SUITE_REPORT:-0} == 1 ]] && break
	for target in "${TARGETS[@]}"; do
		run_unit "$target" "$unit"
		read -r ok err skip ab < <(counts "$OUT/$target/$unit.log")
		bench_log "$target $unit: $ok passed, $err failed, $skip skipped$( ((ab)) && echo ', aborted')"
	done
done

# The table: per unit and target, passed / failed / skipped (+ "!" when
# aborted); with both targets, "lost" counts tests passed directly only.
: >"$OUT/lost.txt"
{
	printf '%-42s' unit
	for target in "${TARGETS[@]}"; do printf ' %20s ' "$target pass/fail/skip"; done
	((${#TARGETS[@]} == 2)) && printf ' %5s' lost
	echo
	declare -A sum
	for unit in "${UNITS[@]}"; do
		printf '%-42s' "$unit"
		for target in "${TARGETS[@]}"; do
			read -r ok err skip ab < <(counts "$OUT/$target/$unit.log")
			printf ' %20s%s' "$ok/$err/$skip" "$( ((ab)) && echo '!' || echo ' ')"
			sum[$target.ok]=$((${sum[$target.ok]:-0} + ok)) sum[$target.err]=$((${sum[$target.err]:-0} + err))
			sum[$target.skip]=$((${sum[$target.skip]:-0} + skip)) sum[$target.ab]=$((${sum[$target.ab]:-0} + ab))
			((ok > 0)) && sum[$target.units]=$((${sum[$target.units]:-0} + 1))
		done
		if ((${#TARGETS[@]} == 2)); then
			lost=$(LC_ALL=C comm -23 <(passed "$OUT/direct/$unit.log") <(passed "$OUT/proxy/$unit.log") |
				sed "s|^|$unit: |" | tee -a "$OUT/lost.txt" | wc -l)
			sum[lost]=$((${sum[lost]:-0} + lost))
			printf ' %5s' "$lost"
		fi
		echo
	done
	printf '%-42s' total
	for target in "${TARGETS[@]}"; do
		printf ' %20s ' "${sum[$target.ok]:-0}/${sum[$target.err]:-0}/${sum[$target.skip]:-0}"
	done
	((${#TARGETS[@]} == 2)) && printf ' %5s' "${sum[lost]:-0}"
	echo
	for target in "${TARGETS[@]}"; do
		echo "$target: ${sum[$target.ok]:-0} passed in ${sum[$target.units]:-0} units, ${sum[$target.err]:-0} failed, ${sum[$target.ab]:-0} units aborted (!)"
	done
} | tee "$OUT/table.txt"
bench_log "logs in $OUT$( ((${#TARGETS[@]} == 2)) && echo "; tests passed directly only: $OUT/lost.txt")"
