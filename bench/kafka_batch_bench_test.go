package bench

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
)

// BenchmarkKafkaConsumeBatch is BenchmarkKafkaConsumeCommit's raw loop and
// ackwise source side by side with the ackwise engine running a no-op
// BatchHandler on batches of up to 500 and 64 records (consumer.NewBatch,
// default Config otherwise), in ABBA order. Run it
// with the broker in a process of its own to read the client's CPU per
// record:
//
//	ACKWISE_BENCH_KFAKE=process go test -run '^$' -bench 'KafkaConsumeBatch/payload=json' -benchtime 1000000x -count 3 .
func BenchmarkKafkaConsumeBatch(b *testing.B) {
	order := []string{"raw-franz-go", "ackwise-source", "ackwise-batch-500", "ackwise-batch-64", "ackwise-batch-64", "ackwise-batch-500", "ackwise-source", "raw-franz-go"}
	run := map[string]func(*testing.B, kafkaPayload){
		"raw-franz-go":      consumeRaw,
		"ackwise-source":    consumeSource,
		"ackwise-batch-500": func(b *testing.B, p kafkaPayload) { consumeBatch(b, p, 500) },
		"ackwise-batch-64":  func(b *testing.B, p kafkaPayload) { consumeBatch(b, p, 64) },
	}
	runPayloads(b, order, run)
}

// consumeBatch runs the engine with a no-op batch handler on batches of up
// to size records.
func consumeBatch(b *testing.B, p kafkaPayload, size int) {
	src, mt := kafkaTimedSource(b, "batch", p)
	var handled atomic.Int64
	all := make(chan struct{})
	h := ackwise.BatchHandlerFunc(func(_ context.Context, msgs []*ackwise.Message) error {
		if handled.Add(int64(len(msgs))) == int64(b.N) {
			close(all)
		}
		return nil
	})
	c, err := consumer.NewBatch(src, h, consumer.Config{Batch: consumer.BatchConfig{Size: size}})
	if err != nil {
		b.Fatal(err)
	}
	runConsumer(b, c, src, all)
	mt.report(b)
}
