package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// buffered signals every record the client buffers from a fetch.
type buffered chan struct{}

func (b buffered) OnFetchRecordBuffered(*kgo.Record) {
	select {
	case b <- struct{}{}:
	default:
	}
}

// TestReadAhead: while the records of one fetch are still being delivered,
// the source takes the client's next fetch as soon as the client has it
// (so the client fetches again), and nothing is lost, repeated or
// reordered on the way.
func TestReadAhead(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	sig := make(buffered, 1)
	// One record batch per fetch: several fetches for a few records.
	cfg.Options = []kgo.Opt{kgo.FetchMaxPartitionBytes(1), kgo.WithHooks(sig)}
	sink := openSink(t, cfg)
	const n = 200
	for i := 0; i < n; i += 50 {
		publishN(t, sink, 50, func(int) string { return "k" })
	}
	src := openSource(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	queued := func() int {
		src.mu.Lock()
		defer src.mu.Unlock()
		return src.queued
	}
	buf := make([]*ackwise.Message, 1)
	sawAhead := false
	for off := int64(0); off < n; off++ {
		if !sawAhead && queued() > 1 && src.cl.BufferedFetchRecords() == 0 {
			// Records of the current fetch remain: wait until the client
			// buffered the next fetch, then see the source take it.
			select {
			case <-sig:
			case <-ctx.Done():
				t.Fatal("the client never buffered another fetch")
			}
		}
		before, next := queued(), src.cl.BufferedFetchRecords()
		k, err := src.Receive(ctx, buf)
		if err != nil || k != 1 {
			t.Fatalf("receive at offset %d: %d, %v", off, k, err)
		}
		if m := buf[0]; m.Offset != off {
			t.Fatalf("received offset %d, want %d", m.Offset, off)
		}
		if err := src.Ack(ctx, buf[0]); err != nil {
			t.Fatal(err)
		}
		if before > 1 && next > 0 && queued() >= before {
			sawAhead = true // delivered from what it had, and took the next fetch too
		}
	}
	if !sawAhead {
		t.Fatal("the source never took a fetch while the last one was still being delivered")
	}
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 0, n)
}

// pollStarts signals every poll of the client.
type pollStarts chan struct{}

func (p pollStarts) OnPollStart(context.Context) {
	select {
	case p <- struct{}{}:
	default:
	}
}

// TestIdleSourceKeepsNoPayloads: messages recycled while Receive waits for
// records do not keep their payloads, which would keep a whole fetch's
// memory alive for as long as the topic stays quiet.
func TestIdleSourceKeepsNoPayloads(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	polls := make(pollStarts, 1)
	cfg.Options = []kgo.Opt{kgo.WithHooks(polls)}
	sink := openSink(t, cfg)
	publishN(t, sink, 3, func(int) string { return "k" })
	src := openSource(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := receiveN(t, src, 3)
	select {
	case <-polls: // a poll of receiveN's: the next is the waiting one's
	default:
	}

	next := make(chan *ackwise.Message, 1)
	go func() {
		buf := make([]*ackwise.Message, 1)
		if n, err := src.Receive(ctx, buf); err == nil && n == 1 {
			next <- buf[0]
			return
		}
		next <- nil
	}()
	// Nothing is pending: the next poll is the one Receive waits in.
	select {
	case <-polls:
	case <-ctx.Done():
		t.Fatal("Receive never waited")
	}
	for _, m := range got {
		if err := src.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	src.Recycle(got...)
	for i, m := range got {
		if m.Payload != nil {
			t.Errorf("message %d recycled while the source waits still holds its payload", i)
		}
	}
	publishN(t, sink, 1, func(int) string { return "k" })
	m := <-next
	if m == nil || m.Offset != 3 || string(m.Payload) != "0" {
		t.Fatalf("after the wait: %+v", m)
	}
}
