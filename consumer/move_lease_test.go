package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/consumer"
)

// A dead letter refused for twice the queue's lease is tried again in place
// with the delivery kept all along (the heartbeat extends its lease while
// the move waits): the message is delivered once, its handler run once, and
// dead-lettered once, when the destination takes it.
func TestPendingMoveKeepsLease(t *testing.T) {
	t.Parallel()
	br, clock := memorytest.NewBroker(t)
	if err := br.CreateQueue("q", memory.QueueConfig{Lease: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := br.CreateQueue("q"+memory.DeadLetterSuffix, memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	// 20 refusals: pauses of 10ms doubling up to 5s, about a minute.
	fault := memorytest.Inject(t, br, "q"+memory.DeadLetterSuffix, memory.Fault{Kind: memory.FaultFailPublish, Count: 20})
	src, err := br.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	var runs atomic.Int64
	dead := make(chan struct{})
	obs := &outcomeLog{on: func(o consumer.Outcome) {
		if o == consumer.DeadLettered {
			close(dead)
		}
	}}
	c, err := consumer.New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		runs.Add(1)
		return ackwise.Permanent(errors.New("invalid order"))
	}), consumer.Config{Clock: clock, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	memorytest.Publish(t, br, "q", memorytest.Msg("m", "k", "x"))
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.SettleFailed >= 1 }) {
		t.Fatalf("the dead letter was not tried: %+v", c.Stats())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	advanceUntil(ctx, t, clock, 10*time.Minute, dead)
	waitIdleQueue(t, c, br, "q")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	memorytest.RequireDeliveries(t, br, "q", "m", 1)
	memorytest.RequireDeadLettered(t, br, "q", "m", "")
	if msgs, _ := br.Messages("q" + memory.DeadLetterSuffix); len(msgs) != 1 {
		t.Fatalf("%d dead letters: want one", len(msgs))
	}
	if st := c.Stats(); runs.Load() != 1 || st.DeadLettered != 1 || st.SettleFailed != uint64(fault.Fired()) || fault.Fired() != 20 || st.Released != 0 {
		t.Fatalf("stats %+v, runs %d, refusals %d: want one run, 20 refusals each SettleFailed, one dead letter", st, runs.Load(), fault.Fired())
	}
}
