package bench

import (
	"context"
	"strconv"
	"testing"
	"unsafe"

	"github.com/ackwise/ackwise"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkKafkaMessageFloor measures the least any library that hands its
// handler an ackwise.Message per record must add to the raw franz-go loop:
// message-floor is consumeRaw plus, for each record, a Message built from it
// (key, header values and a broker ID copied into shared chunks, as the
// ackwise source does) and a Handler called through the interface, in the
// polling goroutine; no offset tracking, no ordering, no engine. It runs
// beside the raw loop and the engine in ABBA order (see
// BenchmarkKafkaConsumeCommit), once per payload:
//
//	go test -run '^$' -bench 'KafkaMessageFloor/payload=json' -benchtime 1000000x .
//
// Its ratio to the raw loop bounds what the engine's ratio can reach on the
// same machine (docs/BENCHMARKS.md).
func BenchmarkKafkaMessageFloor(b *testing.B) {
	order := []string{"raw-franz-go", "message-floor", "ackwise-engine", "ackwise-engine", "message-floor", "raw-franz-go"}
	run := map[string]func(*testing.B, kafkaPayload){
		"raw-franz-go":   consumeRaw,
		"message-floor":  consumeMessageFloor,
		"ackwise-engine": consumeEngine,
	}
	runPayloads(b, order, run)
}

// consumeMessageFloor is consumeRaw with an ackwise.Message built for each
// record and a no-op Handler called on it (see BenchmarkKafkaMessageFloor).
func consumeMessageFloor(b *testing.B, p kafkaPayload) {
	brokers, topic := kafkaFilledTopic(b, "floor", p)
	mt := startMeter()
	ctx := context.Background()
	var sink int
	var h ackwise.Handler = ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		sink += len(m.Payload)
		return nil
	})
	var (
		msg  ackwise.Message
		hdrs = make(ackwise.Headers, 0, 8)
		strs []byte // the chunk strings are carved from
		bid  []byte
	)
	str := func(v []byte) string {
		if len(v) == 0 {
			return ""
		}
		if cap(strs)-len(strs) < len(v) {
			strs = make([]byte, 0, max(2048, len(v)))
		}
		start := len(strs)
		strs = append(strs, v...)
		return unsafe.String(&strs[start], len(v))
	}
	rawLoop(b, b.N, brokers, topic, func(r *kgo.Record) {
		hdrs = hdrs[:0]
		msg = ackwise.Message{Key: str(r.Key), Payload: r.Value, Source: r.Topic, Partition: r.Partition, Offset: r.Offset, Attempt: 1}
		for _, kv := range r.Headers {
			v := str(kv.Value)
			if kv.Key == ackwise.HeaderEventID {
				msg.ID = v
			}
			hdrs = append(hdrs, ackwise.Header{Key: kv.Key, Value: v})
		}
		msg.Headers = hdrs
		bid = strconv.AppendInt(append(append(bid[:0], r.Topic...), '@'), r.Offset, 10)
		msg.BrokerID = str(bid)
		if err := h.Handle(ctx, &msg); err != nil {
			b.Fatal(err)
		}
	})
	mt.report(b)
	_ = sink
}
