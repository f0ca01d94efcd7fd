package kafka

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// BenchmarkDeliverAck measures the source's own work per record, without a
// broker: taking polled records, tracking them, building their messages,
// acking and recycling them. One op is one record.
func BenchmarkDeliverAck(b *testing.B) {
	const batch = 4096
	// PollBatch set: there is no client to read ahead from.
	s := &Source{cfg: SourceConfig{PollBatch: batch}, parts: map[topicPartition]*partition{}, kick: make(chan struct{}, 1)}
	p := newPartition("orders-abcdef", 3, false)
	p.own.Store(ownOwned)
	s.parts[topicPartition{"orders-abcdef", 3}] = p
	recs := make([]*kgo.Record, batch)
	now := time.Now()
	for i := range recs {
		recs[i] = &kgo.Record{Topic: "orders-abcdef", Partition: 3, Key: []byte("key-" + strconv.Itoa(i%1000)), Value: make([]byte, 100), Timestamp: now,
			Headers: []kgo.RecordHeader{{Key: ackwise.HeaderEventID, Value: []byte("ev-" + strconv.Itoa(i))}, {Key: "seq", Value: []byte(strconv.Itoa(i))}}}
	}
	buf := make([]*ackwise.Message, 64)
	ctx := context.Background()
	off := int64(0)
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; {
		b.StopTimer()
		for _, r := range recs {
			r.Offset = off
			off++
		}
		fs := kgo.Fetches{{Topics: []kgo.FetchTopic{{Topic: "orders-abcdef", Partitions: []kgo.FetchPartition{{Partition: 3, Records: append([]*kgo.Record(nil), recs...)}}}}}}
		b.StartTimer()
		s.stash(fs, 1)
		for {
			k, _ := s.deliverPending(buf, now)
			if k == 0 {
				break
			}
			for _, m := range buf[:k] {
				if err := s.Ack(ctx, m); err != nil {
					b.Fatal(err)
				}
			}
			s.Recycle(buf[:k]...)
			n += k
		}
	}
}
