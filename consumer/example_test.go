package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// A handler on the in-memory broker: good orders are acked, an undecodable
// one is dead-lettered at once with its reason, and a transient failure is
// retried.
func Example() {
	ctx := context.Background()
	b, _ := memory.New(memory.Config{})
	_ = b.Publish(ctx, "orders",
		&ackwise.Message{ID: "order-1", Key: "cust-7", Payload: []byte(`{"cents": 4200}`)},
		&ackwise.Message{ID: "order-2", Key: "cust-7", Payload: []byte(`{"cents": "lots"}`)},
		&ackwise.Message{ID: "order-3", Key: "cust-9", Payload: []byte(`{"cents": 100}`)},
	)

	failedOnce := false
	handler := ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		var o struct{ Cents int }
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return ackwise.Permanent(fmt.Errorf("decode order: %w", err))
		}
		if msg.ID == "order-3" && !failedOnce {
			failedOnce = true
			return errors.New("card processor timed out") // transient: retried
		}
		return nil
	})

	src, _ := b.QueueSource("orders")
	defer src.Close()
	c, err := consumer.New(src, handler, consumer.Config{
		Name:        "billing",
		Concurrency: 1,
		Retry:       retry.Policy{InitialInterval: 1, Jitter: retry.NoJitter}, // retry at once, for the example
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	_ = b.WaitHistory(ctx, "orders", func(events []memory.Event) bool {
		settled := 0
		for _, e := range events {
			if e.Kind == memory.EventAcked || e.Kind == memory.EventDeadLettered {
				settled++
			}
		}
		return settled == 3
	})
	stop()
	<-done

	st := c.Stats()
	fmt.Printf("acked=%d retried=%d dead_lettered=%d\n", st.Acked, st.Retried, st.DeadLettered)
	dead, _ := b.Messages("orders.dlq")
	env, _ := dlq.Decode(dead[0].Headers)
	fmt.Println(dead[0].ID, env.Reason, env.Consumer)
	// Output:
	// acked=2 retried=1 dead_lettered=1
	// order-2 permanent billing
}
