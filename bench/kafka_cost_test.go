package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise/adapters/kafka"
)

// The cost harness of bench/callgrind.sh: with ACKWISE_BENCH_COST set, the
// test binary does one step against a running broker and exits (TestMain),
// so that valgrind counts the consuming process alone, without producing
// the records or serving them:
//
//	ACKWISE_BENCH_COST=produce|raw|source
//	ACKWISE_BENCH_COST_BROKER=host:port  the broker (a kfake process)
//	ACKWISE_BENCH_COST_TOPIC=name        produce: created and filled; others: consumed, group name+"-g"
//	ACKWISE_BENCH_COST_N=records         how many (a consume reads the whole topic: produce exactly N)
//	ACKWISE_BENCH_COST_PARTITIONS=n      produce only; default kafkaPartitions
//
// The records are those of BenchmarkKafkaConsumeCommit's json payload:
// kafkaKeys keys, two headers. The consume steps are that benchmark's
// variants consumeRaw and consumeSource without the meter; the engine's is
// in the consumer package's tests (consumer/kafka_cost_test.go), where it
// can pin the hand-off pace.
const costEnv = "ACKWISE_BENCH_COST"

// serveCost runs the step ACKWISE_BENCH_COST names and returns the exit
// code.
func serveCost() int {
	var f exitOnFatal
	brokers := []string{os.Getenv(costEnv + "_BROKER")}
	topic := os.Getenv(costEnv + "_TOPIC")
	n, err := strconv.Atoi(os.Getenv(costEnv + "_N"))
	if err != nil || n < 1 || brokers[0] == "" || topic == "" {
		f.Fatalf("%s: set %s_BROKER, %s_TOPIC and %s_N (>= 1)", costEnv, costEnv, costEnv, costEnv)
	}
	json := kafkaPayloads[1]
	switch mode := os.Getenv(costEnv); mode {
	case "produce":
		parts := int32(kafkaPartitions)
		if v := os.Getenv(costEnv + "_PARTITIONS"); v != "" {
			p, err := strconv.Atoi(v)
			if err != nil || p < 1 {
				f.Fatalf("%s_PARTITIONS=%q: want a count >= 1", costEnv, v)
			}
			parts = int32(p)
		}
		kafkaProduce(f, brokers, topic, parts, n, kafkaKeys, json)
	case "raw":
		var sink int
		rawLoop(f, n, brokers, topic, func(r *kgo.Record) { sink += len(r.Value) })
		_ = sink
	case "source":
		// CommitInterval scaled as valgrind slows the run (see
		// consumer/kafka_cost_test.go).
		src, err := kafka.NewSource(context.Background(), kafka.SourceConfig{ClientConfig: kafka.ClientConfig{Brokers: brokers}, Topic: topic, Group: topic + "-g", CommitInterval: 10 * time.Second})
		if err != nil {
			f.Fatal(err)
		}
		sourceLoop(f, src, n)
	default:
		f.Fatalf("%s=%q: want produce, raw or source", costEnv, mode)
	}
	return 0
}

// exitOnFatal is the fataler of the cost harness: it prints and exits 1.
type exitOnFatal struct{}

func (exitOnFatal) Helper() {}

func (exitOnFatal) Fatal(args ...any) {
	fmt.Fprintln(os.Stderr, args...)
	os.Exit(1)
}

func (exitOnFatal) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}
