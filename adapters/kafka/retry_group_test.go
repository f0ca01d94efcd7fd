package kafka

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
)

// TestRetryTopicSharedByGroups: two consumer groups on one topic with the
// same retry tiers share the retry topics (their names carry the topic, not
// the group). Each group must handle only the retries it moved: before, a
// group consumed every record of its retry topics, and handled the other
// group's failures as its own (a second effect of a record it had already
// handled).
func TestRetryTopicSharedByGroups(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfgA := testConfig(t, brokers, 1, time.Second)
	cfgB := cfgA
	cfgB.Group = cfgA.Topic + "-other"
	in := publishN(t, openSink(t, cfgA), 1, func(int) string { return "k" })[0]
	a := openSource(t, cfgA)
	b := openSource(t, cfgB)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// B acks whatever it receives, and keeps it for the check below.
	var mu sync.Mutex
	var gotB []*ackwise.Message
	bctx, bstop := context.WithCancel(ctx)
	bdone := make(chan struct{})
	go func() {
		defer close(bdone)
		buf := make([]*ackwise.Message, 8)
		for {
			n, err := b.Receive(bctx, buf)
			if err != nil {
				return
			}
			for _, m := range buf[:n] {
				mu.Lock()
				gotB = append(gotB, &ackwise.Message{ID: m.ID, Attempt: m.Attempt, Source: m.Source})
				mu.Unlock()
				_ = b.Ack(bctx, m)
			}
		}
	}()

	// A fails the record: it moves to the retry topic, tagged with A's group.
	m := receiveN(t, a, 1)[0]
	if err := a.Nack(ctx, m, time.Second); err != nil {
		t.Fatal(err)
	}
	retry := receiveN(t, a, 1)[0]
	if retry.ID != in.ID || retry.Attempt != 2 {
		t.Fatalf("A's retry: %s attempt %d", retry.ID, retry.Attempt)
	}
	if err := a.Ack(ctx, retry); err != nil {
		t.Fatal(err)
	}
	// B has gone past the retry record once its group commits past it.
	waitCommitted(t, brokers, cfgB.Group, DefaultRetryTopic(cfgA.Topic, time.Second), 0, 1)
	bstop()
	<-bdone
	mu.Lock()
	defer mu.Unlock()
	for _, g := range gotB {
		if g.Attempt > 1 {
			t.Fatalf("group B handled group A's retry of %s (attempt %d)", g.ID, g.Attempt)
		}
	}
	if len(gotB) != 1 || gotB[0].ID != in.ID {
		t.Fatalf("group B received %d messages, want the original record once", len(gotB))
	}
}
