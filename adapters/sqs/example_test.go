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

// Broker-managed dead letters: the queue's RedrivePolicy (maxReceiveCount
// 5) moves a message the consumer gave up on, as it is, without the
// envelope. The source refuses to open unless max_attempts, the
// consumer's Retry.MaxAttempts, agrees with maxReceiveCount. Compiled
// only: it needs SQS.
func ExampleNewSource_brokerDeadLetters() {
	ctx := context.Background()
	const attempts = 5
	src, err := sqs.NewSource(ctx, sqs.Config{
		QueueURL:    "https://sqs.us-east-2.amazonaws.com/123456789012/orders",
		DeadLetters: sqs.DeadLetterBroker,
		MaxAttempts: attempts,
	})
	if err != nil {
		log.Fatal(err) // no RedrivePolicy, or its maxReceiveCount is not 5
	}
	defer src.Close()
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error { return nil })
	c, err := consumer.New(src, h, consumer.Config{Retry: retry.Policy{MaxAttempts: attempts, InitialInterval: 30 * time.Second}})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Moving dead letters back to their queue with SQS's own move task, 50 a
// second, once the cause is fixed. Compiled only: it needs SQS.
func ExampleMoveTask() {
	ctx := context.Background()
	res, err := sqs.MoveTask(ctx, sqs.Connection{},
		"https://sqs.us-east-2.amazonaws.com/123456789012/orders-dlq",
		"https://sqs.us-east-2.amazonaws.com/123456789012/orders",
		sqs.MoveOptions{MaxPerSecond: 50, Progress: func(r sqs.MoveResult) { log.Printf("%d of %d moved", r.Moved, r.ToMove) }})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("%s: %d moved in %v", res.Status, res.Moved, res.Elapsed)
}
