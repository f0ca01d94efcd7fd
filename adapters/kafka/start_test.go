package kafka

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
)

// TestStartLatest: StartOffset "latest" skips what the main topic held
// before the group first joined, but not the retries the group moved to a
// retry topic that has no commit yet. Before, "latest" applied to the retry
// topics too: a retry moved by a member that stopped before it consumed the
// retry partition (its source offset committed past the record) was skipped
// by the next member, lost.
func TestStartLatest(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1, time.Second)
	cfg.StartOffset = "latest"
	sink := openSink(t, cfg)
	old := publishN(t, sink, 1, func(int) string { return "k" })[0]
	a := openSource(t, cfg)

	// Publish markers until a receives one: the first record a receives
	// must be a marker, not the record published before the group joined.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := make(chan *ackwise.Message, 1)
	go func() {
		buf := make([]*ackwise.Message, 1)
		if n, err := a.Receive(ctx, buf); n == 1 && err == nil {
			got <- buf[0]
		}
		close(got)
	}()
	var first *ackwise.Message
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for i := 0; first == nil; i++ {
		if err := sink.Publish(ctx, &ackwise.Message{ID: fmt.Sprintf("marker-%d", i), Key: "k"}); err != nil {
			t.Fatal(err)
		}
		select {
		case first = <-got:
			if first == nil {
				t.Fatal("Receive failed")
			}
		case <-tick.C:
		}
	}
	if first.ID == old.ID {
		t.Fatalf("latest: received %s, published before the group joined", old.ID)
	}

	// a moves it to the retry topic and stops before consuming the retry.
	if err := a.Nack(ctx, first, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 0, first.Offset+1)

	// The next member, also "latest", must deliver the retry.
	b := openSource(t, cfg)
	for {
		buf := make([]*ackwise.Message, 1)
		n, err := b.Receive(ctx, buf)
		if err != nil || n != 1 {
			t.Fatalf("the retry of %s was not delivered (%d, %v): lost", first.ID, n, err)
		}
		m := buf[0]
		if m.ID == old.ID {
			t.Fatalf("latest: the next member received %s, published before the group joined", old.ID)
		}
		if err := b.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
		if m.ID == first.ID {
			if m.Attempt != 2 {
				t.Fatalf("retry of %s at attempt %d, want 2", m.ID, m.Attempt)
			}
			return
		}
	}
}
