package kafka

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestTransactSessionFencedBySameID: a second session with the same
// TransactionalID fences the first; the first's Run returns an error
// instead of carrying on, and every input is committed exactly once.
func TestTransactSessionFencedBySameID(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 2)
	out := cfg.Topic + ".out"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := CreateTopics(ctx, Config{Brokers: brokers, Topic: out}, 2, 1); err != nil {
		t.Fatal(err)
	}
	sink := openSink(t, cfg)
	in := publishN(t, sink, 10, func(i int) string { return "k" + string(rune('a'+i%5)) })
	var calls atomic.Int64
	fn := func(_ context.Context, m *ackwise.Message, emit func(Output)) error {
		calls.Add(1)
		emit(Output{Topic: out, Key: m.Key, Payload: m.Payload, ID: m.BrokerID})
		return nil
	}
	a, err := NewTransactSession(ctx, TransactConfig{Config: cfg, TransactionalID: cfg.Topic + "-tx"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	aDone := make(chan error, 1)
	go func() { aDone <- a.Run(ctx, fn) }()
	for calls.Load() < 10 {
		time.Sleep(10 * time.Millisecond)
	}
	b, err := NewTransactSession(ctx, TransactConfig{Config: cfg, TransactionalID: cfg.Topic + "-tx"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	bCtx, bStop := context.WithCancel(ctx)
	bDone := make(chan error, 1)
	var bCalls atomic.Int64
	go func() {
		bDone <- b.Run(bCtx, func(ctx context.Context, m *ackwise.Message, emit func(Output)) error {
			bCalls.Add(1)
			return fn(ctx, m, emit)
		})
	}()
	// B's producer fences A's at B's first transaction.
	for bCalls.Load() == 0 {
		in = append(in, publishN(t, sink, 10, func(i int) string { return "k" + string(rune('a'+i%5)) })...)
		time.Sleep(200 * time.Millisecond)
	}
	// A learns of the fence at its next transaction, so it needs records
	// of its own partitions: keep publishing until its Run returns.
	giveUp := time.After(20 * time.Second)
wait:
	for {
		in = append(in, publishN(t, sink, 10, func(i int) string { return "k" + string(rune('a'+i%5)) })...)
		select {
		case err := <-aDone:
			t.Logf("fenced Run: %v", err)
			if err == nil {
				t.Error("fenced Run returned nil")
			}
			break wait
		case <-giveUp:
			t.Fatal("fenced session's Run still running 20s after it was fenced, with records to handle")
		case <-time.After(200 * time.Millisecond): // publish more: A may own no partition with new records yet
		}
	}
	a.Close()
	deadline := time.Now().Add(10 * time.Second)
	for committed(ctx, t, brokers, cfg.Group, cfg.Topic, 0)+committed(ctx, t, brokers, cfg.Group, cfg.Topic, 1) < int64(len(in)) {
		if time.Now().After(deadline) {
			t.Fatal("inputs never all committed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	bStop()
	<-bDone
	seen := map[string]int{}
	for _, r := range readIsolated(ctx, t, brokers, out, kgo.ReadCommitted()) {
		seen[recordMessage(r).ID]++
	}
	for p, end := range map[int32]int64{0: committed(ctx, t, brokers, cfg.Group, cfg.Topic, 0), 1: committed(ctx, t, brokers, cfg.Group, cfg.Topic, 1)} {
		for o := int64(0); o < end; o++ {
			id := fmt.Sprintf("%s/%d@%d", cfg.Topic, p, o)
			if seen[id] != 1 {
				t.Errorf("read_committed sees the output of %s %d times, want once", id, seen[id])
			}
			delete(seen, id)
		}
	}
	for id, n := range seen {
		t.Errorf("read_committed sees %d outputs of %s, whose input offset is not committed", n, id)
	}
}
