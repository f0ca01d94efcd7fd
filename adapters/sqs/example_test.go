package sqs_test

import (
	"context"
	"log"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/sqs"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// A consumer of an SQS queue opened by URL: retries wait out their delay
// at the broker (the message's visibility timeout), and a message that
// keeps failing goes to orders-dlq with the dead-letter envelope. It needs
// SQS (credentials from the AWS chain), so it has no Output and is only
// compiled.
func Example() {
	ctx := context.Background()
	src, err := adapters.OpenSource(ctx, "awssqs://sqs.us-east-2.amazonaws.com/123456789012/orders?dlq=orders-dlq")
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
		log.Printf("order %s, attempt %d", m.ID, m.Attempt)
		return nil
	})
	policy := retry.Policy{MaxAttempts: 5, InitialInterval: 30 * time.Second}
	c, err := consumer.New(src, h, consumer.Config{Concurrency: 16, MaxInFlight: 40, Retry: policy})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Publishing to a FIFO queue: each message's group is its key and its
// deduplication ID its event ID, so two top-ups with equal bodies both go
// through, and a retried Publish of the same event does not.
func ExampleSink_Publish() {
	ctx := context.Background()
	sink, err := sqs.NewSink(ctx, sqs.SinkConfig{QueueURL: "https://sqs.us-east-2.amazonaws.com/123456789012/top-ups.fifo"})
	if err != nil {
		log.Fatal(err)
	}
	defer sink.Close()
	err = sink.Publish(ctx,
		&ackwise.Message{ID: "top-up-7f3a", Key: "wallet-42", Payload: []byte(`{"amount":5}`)},
		&ackwise.Message{ID: "top-up-9c1e", Key: "wallet-42", Payload: []byte(`{"amount":5}`)},
	)
	for _, f := range adapters.PublishFailures(err, 2) {
		log.Printf("message %d not published: %v", f.Index, f.Err)
	}
}
