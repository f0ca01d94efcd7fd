#!/bin/sh
# callgrind.sh: instructions per record of Kafka consumers, counted by
# valgrind (callgrind), for machines without hardware counters (see
# /work/shared/TESTING.md, "Benchmarks", and docs/BENCHMARKS.md, "Kafka").
#
#   bench/callgrind.sh [variant...]     (default: raw engine)
#
# Variants: raw (the raw franz-go poll/commit loop), source (the ackwise
# source driven directly: Receive, Ack, Recycle), engine (the engine on the
# source, no-op handler, default Config) with its hand-off pace pinned
# inline, engine:PACE with PACE one of inline, batch, single or auto (not
# pinned), batch (a no-op batch handler on batches of up to 500,
# consumer.NewBatch, pace pinned inline) and batch:SIZE. Natively the
# engine runs this benchmark inline (batch now and then); under valgrind, ~50 times slower, an adaptive engine measures slow
# messages and hands each to a worker alone (single), which costs a channel
# hand-off and a select per message that a native run does not pay.
#
# Environment: SMALL and LARGE (record counts, default 50000 and 200000),
# PARTITIONS (default 4, as BenchmarkKafkaConsumeCommit), OUT (default
# /tmp/ackwise-callgrind: the test binary, the callgrind files, the logs).
#
# What it does: builds the bench test binary, starts a kfake broker with it
# in a process of its own (not under valgrind), and for each variant and
# count creates a topic of exactly that many json records (the payload of
# BenchmarkKafkaConsumeCommit), then consumes it under
#   GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off valgrind --tool=callgrind
# in a fresh process (the harness is bench/kafka_cost_test.go, and
# consumer/kafka_cost_test.go for the engine). valgrind
# 3.19 does not know RDTSCP, which Go's runtime uses when the CPU has it:
# cpu.rdtscp=off keeps the runtime off it (golang.org/x/sys/cpu prints that
# it does not know the option; harmless).
#
# It prints, per variant, the marginal instructions per record between the
# two counts, (Ir(LARGE) - Ir(SMALL)) / (LARGE - SMALL), which cancels what
# does not grow with the records (start, joining the group, leaving):
#   total   every instruction of the process;
#   gc      the self cost of the garbage collector's functions (marking,
#           sweeping, write barriers, assists: the GC_RE below), which
#           varies with timing under valgrind;
#   non-gc  total - gc: the figure to steer by.
# and the 25 functions with the largest marginal non-GC self cost (the
# file a function's instructions were inlined from is dropped: a function's
# cost includes what was inlined into it). Inclusive costs are not used:
# goroutine switches make callgrind's call stacks meaningless.
#
# One run of both default variants takes ~1 minute on 2 cores.
set -eu
export LC_ALL=C

cd "$(dirname "$0")"
SMALL=${SMALL:-50000}
LARGE=${LARGE:-200000}
PARTITIONS=${PARTITIONS:-4}
OUT=${OUT:-/tmp/ackwise-callgrind}
VARIANTS=${*:-raw engine}
GC_RE='^(runtime\.(gcBgMarkWorker|gcmarknewobject|deductAssistCredit|gcWriteBarrier[0-9]*|gcDrain|gcDrainN|gcDrainMarkWorker[A-Za-z]*|markroot[A-Za-z]*|scanobject|scanObject[A-Za-z]*|scanblock|scanstack|scanframeworker|scanConservative|greyobject|tryDeferToSpanScan|findObject|spanOfHeap|wbBufFlush1?|bulkBarrierPreWrite|bulkBarrierPreWriteSrcOnly|typePointers\.next|typePointers\.nextFast|extractHeapBitsSmall|gcAssistAlloc1?|gcParkAssist|gcFlushBgCredit|gcMarkDone|gcMarkTermination|gcMarkTinyAllocs|gcResetMarkState|gcSweep|bgsweep|sweepone|bgscavenge|scavengeOne|markBits[A-Za-z.]*|heapBitsSmallForAddr|\(\*gcWork\)\..*|\(\*gcBits\)\..*|\(\*spanQueue\)\..*|\(\*spanSPMCs?\)\..*|\(\*mspan\)\.(sweep|markBitsForIndex|isFree|typePointersOf.*|heapBitsSmallForAddr)|\(\*sweepLocked\)\.sweep|\(\*spanInlineMarkBits\)\..*|\(\*gcControllerState\)\..*|\(\*mspan\)\.scan.*|scanSpan.*|\(\*mheap\)\.nextSpanForSweep|\(\*sweepLocker\)\..*|\(\*activeSweep\)\..*|\(\*pageAlloc\)\.scavenge.*|\(\*scavengerState\)\..*)|gcWriteBarrier.*)$'

mkdir -p "$OUT"
go test -c -o "$OUT/bench.test" .
(cd .. && go test -c -o "$OUT/consumer.test" ./consumer)

ACKWISE_BENCH_KFAKE_CHILD=1 "$OUT/bench.test" -test.run='^$' >"$OUT/broker.log" 2>&1 &
broker=$!
trap 'kill $broker 2>/dev/null' EXIT INT TERM
addr=
for _ in $(seq 100); do
	addr=$(sed -n 's/^READY //p' "$OUT/broker.log")
	[ -n "$addr" ] && break
	sleep 0.1
done
[ -n "$addr" ] || { echo "callgrind.sh: broker not listening" >&2; cat "$OUT/broker.log" >&2; exit 1; }
export ACKWISE_BENCH_COST_BROKER="$addr" ACKWISE_BENCH_COST_PARTITIONS="$PARTITIONS"

# selfcost FILE: "function self-Ir" for every function of a callgrind file,
# recursion levels and inlined-from files merged.
selfcost() {
	callgrind_annotate --auto=no --threshold=100 "$1" 2>/dev/null |
		awk '/^ *[0-9,]+ .*:/ {
			ir = $1; gsub(",", "", ir)
			fn = $0; sub(/^ *[0-9,]+ (\([ 0-9.%]+\) )? */, "", fn)
			sub(/ \[[^]]*\]$/, "", fn); sub(/^[^:]*:/, "", fn); sub(/'"'"'[0-9]+$/, "", fn); gsub(/ /, "_", fn)
			cost[fn] += ir
		} END { for (f in cost) print f, cost[f] }' | sort
}

stamp=$(date +%s)
echo "load: $(cat /proc/loadavg)"
for v in $VARIANTS; do
	for n in "$SMALL" "$LARGE"; do
		topic="cost-$(echo "$v" | tr : -)-$n-$stamp"
		ACKWISE_BENCH_COST=produce ACKWISE_BENCH_COST_TOPIC="$topic" ACKWISE_BENCH_COST_N="$n" "$OUT/bench.test"
		bin=bench.test mode=$v pace= batch=
		case $v in
		engine) bin=consumer.test mode=engine pace=inline ;;
		batch) bin=consumer.test mode=engine pace=inline batch=500 ;;
		batch:*) bin=consumer.test mode=engine pace=inline batch=${v#batch:} ;;
		engine:*) bin=consumer.test mode=engine pace=${v#engine:} ;;
		esac
		GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off ACKWISE_BENCH_COST="$mode" ACKWISE_BENCH_COST_PACE="$pace" ACKWISE_BENCH_COST_BATCH="$batch" \
			ACKWISE_BENCH_COST_TOPIC="$topic" ACKWISE_BENCH_COST_N="$n" \
			valgrind --tool=callgrind --callgrind-out-file="$OUT/$v-$n.out" "$OUT/$bin" >"$OUT/$v-$n.log" 2>&1 ||
			{ echo "callgrind.sh: $v $n failed, see $OUT/$v-$n.log" >&2; exit 1; }
		selfcost "$OUT/$v-$n.out" >"$OUT/$v-$n.self"
	done
	LC_ALL=C join -a1 -a2 -e0 -o 0,1.2,2.2 "$OUT/$v-$SMALL.self" "$OUT/$v-$LARGE.self" |
		GC_RE="$GC_RE" awk -v d=$((LARGE - SMALL)) '{ m = ($3 - $2) / d; print ($1 ~ ENVIRON["GC_RE"] ? "gc" : "non"), m, $1 }' >"$OUT/$v.marginal"
	awk -v v="$v" '{ t += $2; if ($1 == "gc") g += $2 }
		END { printf "%s: total %.0f, gc %.0f, non-gc %.0f instructions per record\n", v, t, g, t - g }' "$OUT/$v.marginal"
	sed -n 's/^pace at the end: /  pace at the end (valgrind): /p' "$OUT/$v-$LARGE.log"
	awk '$1 == "non" { printf "  %8.1f  %s\n", $2, $3 }' "$OUT/$v.marginal" | sort -rn | head -25
done
echo "load: $(cat /proc/loadavg)"
