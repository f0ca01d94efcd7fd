package rabbitmq_test

import (
	"context"
	"log"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/rabbitmq"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// A consumer on a quorum queue whose retries wait in per-tier wait queues
// that follow the retry policy. It needs a RabbitMQ server, so it has no
// Output and is only compiled.
func Example() {
	ctx := context.Background()
	policy := retry.Policy{MaxAttempts: 6, Tiers: []time.Duration{time.Second, 10 * time.Second, time.Minute}}
	src, err := rabbitmq.NewSource(ctx, rabbitmq.Config{
		URL:             "amqp://guest:guest@localhost:5672/",
		Queue:           "orders",
		QueueType:       rabbitmq.Quorum,
		Prefetch:        64,
		DeclareTopology: true,
		DelayTiers:      rabbitmq.TiersFor(policy), // orders.wait.1s, orders.wait.10s, orders.wait.1m
	})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
		log.Printf("order %s, attempt %d", m.ID, m.Attempt)
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{Concurrency: 32, MaxInFlight: 64, Retry: policy})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Publishing with confirms: Publish returns once the broker has taken
// every message, and fails with ErrUnroutable when no queue takes one.
func ExampleSink_Publish() {
	ctx := context.Background()
	sink, err := rabbitmq.NewSink(ctx, rabbitmq.SinkConfig{URL: "amqp://guest:guest@localhost:5672/", RoutingKey: "orders"})
	if err != nil {
		log.Fatal(err)
	}
	defer sink.Close()
	err = sink.Publish(ctx,
		&ackwise.Message{ID: "order-1001-created", Key: "order-1001", Payload: []byte(`{"total":42}`)},
		&ackwise.Message{ID: "order-1002-created", Key: "order-1002", Payload: []byte(`{"total":7}`)},
	)
	if err != nil {
		log.Fatal(err)
	}
}
