package kafka

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// TestSettleRefusals checks, without a broker, what a settle refuses: a
// second ack of a delivery, a recycled message, a message of no source and
// nil, a message of a partition revoked and sealed; and that AckBatch
// reports each message's error in its place.
func TestSettleRefusals(t *testing.T) {
	s := &Source{cfg: SourceConfig{PollBatch: 8}, parts: map[topicPartition]*partition{}, kick: make(chan struct{}, 1)}
	ps := []*partition{newPartition("orders", 0, false), newPartition("orders", 1, false)}
	var fs kgo.FetchTopic
	fs.Topic = "orders"
	for _, p := range ps {
		p.own.Store(ownOwned)
		s.parts[topicPartition{"orders", p.id}] = p
		var recs []*kgo.Record
		for off := int64(0); off < 4; off++ {
			recs = append(recs, &kgo.Record{Topic: "orders", Partition: p.id, Offset: off, Key: []byte("k"), Value: []byte("v")})
		}
		fs.Partitions = append(fs.Partitions, kgo.FetchPartition{Partition: p.id, Records: recs})
	}
	s.stash(kgo.Fetches{{Topics: []kgo.FetchTopic{fs}}}, 1)
	buf := make([]*ackwise.Message, 8)
	n, _ := s.deliverPending(buf, time.Now())
	if n != 8 {
		t.Fatalf("delivered %d records, want 8", n)
	}
	ctx := context.Background()
	p0 := buf[:4] // partition 0, offsets 0..3
	p1 := buf[4:] // partition 1

	if err := s.Ack(ctx, p0[0]); err != nil {
		t.Fatalf("first ack: %v", err)
	}
	if err := s.Ack(ctx, p0[0]); err == nil || !strings.Contains(err.Error(), "already settled") {
		t.Fatalf("second ack: %v, want already settled", err)
	}
	if got := ps[0].commitOff; got != 1 {
		t.Fatalf("commit offset %d after acking offset 0, want 1", got)
	}
	s.Recycle(p0[0])
	if err := s.Ack(ctx, p0[0]); err == nil || !strings.Contains(err.Error(), "recycled") {
		t.Fatalf("ack of a recycled message: %v, want recycled", err)
	}
	if err := s.Ack(ctx, &ackwise.Message{BrokerID: "x"}); err == nil || !strings.Contains(err.Error(), "not delivered by a kafka source") {
		t.Fatalf("ack of a foreign message: %v", err)
	}
	if err := s.Ack(ctx, nil); err == nil {
		t.Fatal("ack of nil: no error")
	}

	ps[1].own.Store(ownSealed)
	errs := make([]error, 4)
	s.AckBatch(ctx, []*ackwise.Message{p0[1], p1[0], p0[1], p0[2]}, errs)
	if errs[0] != nil || errs[3] != nil {
		t.Fatalf("AckBatch of owned, in flight messages: %v, %v", errs[0], errs[3])
	}
	if !errors.Is(errs[1], adapters.ErrReceiptInvalid) {
		t.Fatalf("AckBatch of a sealed partition's message: %v, want ErrReceiptInvalid", errs[1])
	}
	if errs[2] == nil || !strings.Contains(errs[2].Error(), "already settled") {
		t.Fatalf("AckBatch of a message twice: %v, want already settled", errs[2])
	}
	if got := ps[0].commitOff; got != 3 {
		t.Fatalf("commit offset %d after acking offsets 0..2, want 3", got)
	}
	if got := ps[1].commitOff; got != 0 {
		t.Fatalf("sealed partition's commit offset %d, want 0 (nothing settled)", got)
	}
}
