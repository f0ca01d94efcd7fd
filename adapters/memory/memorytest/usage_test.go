package memorytest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/dlq"
)

// consume is a stand-in for the application's consumer: it acks valid
// orders and dead-letters the others.
func consume(ctx context.Context, b *memory.Broker, src *memory.QueueSource) {
	buf := make([]*ackwise.Message, 8)
	for {
		n, err := src.Receive(ctx, buf)
		if err != nil {
			return
		}
		for _, m := range buf[:n] {
			if string(m.Payload) == "bad" {
				env := dlq.New(m, dlq.ReasonPermanent, errors.New("invalid order"), ackwise.ClassPermanent, b.Clock().Now(), "orders-svc", "")
				_ = src.DeadLetter(ctx, m, env)
				continue
			}
			_ = src.Ack(ctx, m)
		}
	}
}

// How an application's test uses the helpers: publish, run the consumer,
// assert on what the broker saw. (A test function: the helpers need the
// test's t.)
func TestApplicationStyle(t *testing.T) {
	t.Parallel()
	b, err := memory.New(memory.Config{Clock: memory.NewVirtualClock(time.Time{})})
	if err != nil {
		t.Fatal(err)
	}
	src, err := b.QueueSource("orders")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go consume(ctx, b, src)

	memorytest.Publish(t, b, "orders",
		memorytest.Msg("evt-1", "cust-7", "ok"),
		memorytest.Msg("evt-2", "cust-7", "bad"),
		memorytest.Msg("evt-3", "cust-7", "ok"))

	memorytest.WaitForAcked(t, b, "orders", "evt-3")
	memorytest.RequireAcked(t, b, "orders", "evt-1")
	dl := memorytest.RequireDeadLettered(t, b, "orders", "evt-2", dlq.ReasonPermanent)
	if dl.Envelope.Error != "invalid order" || string(dl.Message.Payload) != "bad" || dl.Event.To != "orders.dlq" {
		t.Fatalf("dead letter %+v", dl)
	}
	if got := fmt.Sprint(memorytest.RequireHandledInOrder(t, b, "orders", "cust-7")); got != "[evt-1 evt-2 evt-3]" {
		t.Fatalf("order %s", got)
	}
}
