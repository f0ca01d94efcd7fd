package memory_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
)

// A queue on a virtual clock: a nacked message comes back after its delay
// as attempt 2, without the example waiting ten minutes.
func Example() {
	clk := memory.NewVirtualClock(time.Time{})
	b, _ := memory.New(memory.Config{Clock: clk})
	_ = b.CreateQueue("orders", memory.QueueConfig{Lease: 30 * time.Second})
	src, _ := b.QueueSource("orders")
	defer src.Close()
	ctx := context.Background()

	_ = b.Publish(ctx, "orders", &ackwise.Message{ID: "evt-1", Key: "cust-7", Payload: []byte(`{"total":42}`)})
	buf := make([]*ackwise.Message, 10)
	n, _ := src.Receive(ctx, buf)
	fmt.Println(n, buf[0].ID, "attempt", buf[0].Attempt)

	_ = src.Nack(ctx, buf[0], 10*time.Minute)
	clk.Advance(10 * time.Minute)
	n, _ = src.Receive(ctx, buf)
	fmt.Println(n, buf[0].ID, "attempt", buf[0].Attempt)
	_ = src.Ack(ctx, buf[0])

	evs, _ := b.History("orders")
	for _, e := range evs {
		fmt.Println(e.Kind, e.Attempt, e.Delay)
	}
	// Output:
	// 1 evt-1 attempt 1
	// 1 evt-1 attempt 2
	// published 0 0s
	// delivered 1 0s
	// nacked 1 10m0s
	// delivered 2 0s
	// acked 2 0s
}

// A consumer group on a log commits only a settled prefix: the ack of
// offset 1 waits for offset 0.
func Example_log() {
	b, _ := memory.New(memory.Config{})
	_ = b.CreateTopic("events", memory.TopicConfig{Partitions: 1})
	src, _ := b.JoinGroup("events", "billing")
	defer src.Close()
	ctx := context.Background()
	_ = b.Publish(ctx, "events", &ackwise.Message{ID: "a"}, &ackwise.Message{ID: "b"})

	buf := make([]*ackwise.Message, 2)
	src.Receive(ctx, buf)
	_ = src.Ack(ctx, buf[1])
	c, _ := b.Committed("events", "billing")
	fmt.Println("after acking offset 1:", c)
	_ = src.Ack(ctx, buf[0])
	c, _ = b.Committed("events", "billing")
	fmt.Println("after acking offset 0:", c)
	// Output:
	// after acking offset 1: [0]
	// after acking offset 0: [2]
}

// An injected crash between the handler and the ack: the Ack fails, the
// source is dead, and the message comes back after its lease.
func Example_crash() {
	clk := memory.NewVirtualClock(time.Time{})
	b, _ := memory.New(memory.Config{Clock: clk})
	ctx := context.Background()
	src, _ := b.QueueSource("orders")
	_, _ = b.InjectFault("orders", memory.Fault{Kind: memory.FaultCrashBeforeAck, Count: 1})
	_ = b.Publish(ctx, "orders", &ackwise.Message{ID: "evt-1"})

	buf := make([]*ackwise.Message, 1)
	src.Receive(ctx, buf)
	err := src.Ack(ctx, buf[0])
	fmt.Println(errors.Is(err, memory.ErrCrashed))

	restarted, _ := b.QueueSource("orders")
	defer restarted.Close()
	clk.Advance(memory.DefaultLease)
	restarted.Receive(ctx, buf)
	fmt.Println(buf[0].ID, "attempt", buf[0].Attempt, restarted.Ack(ctx, buf[0]))
	// Output:
	// true
	// evt-1 attempt 2 <nil>
}

// Opening by URL: "mem://NAME" is a queue on memory.Default().
func Example_url() {
	ctx := context.Background()
	sink, _ := adapters.OpenSink(ctx, "mem://example-url?lease=5s")
	src, _ := adapters.OpenSource(ctx, "mem://example-url")
	defer src.Close()
	_ = sink.Publish(ctx, &ackwise.Message{ID: "x", Payload: []byte("hi")})
	buf := make([]*ackwise.Message, 1)
	src.Receive(ctx, buf)
	fmt.Println(buf[0].ID, string(buf[0].Payload), src.Capabilities().Lease)
	// Output: x hi 5s
}
