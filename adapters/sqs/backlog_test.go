package sqs

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/ackwise/ackwise"
)

// TestBacklogCountsTheQueue: Backlog is 0 on an empty queue and the number
// of messages sent once they are there, also after the source received (it
// asks SQS each time); a queue deleted under the source is an error,
// never 0.
func TestBacklogCountsTheQueue(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, conn := testClient(t), testConn(t)
	q := createQueue(t, c, "backlog", 0, false)
	src, err := NewSource(ctx, Config{QueueURL: q, Connection: conn, WaitTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if n, err := src.Backlog(ctx); n != 0 || err != nil {
		t.Fatalf("Backlog of an empty queue = %d, %v; want 0", n, err)
	}
	sink, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: conn})
	if err != nil {
		t.Fatal(err)
	}
	const sent = 23
	msgs := make([]*ackwise.Message, sent)
	for i := range msgs {
		msgs[i] = &ackwise.Message{ID: fmt.Sprint("b", i), Payload: []byte("x")}
	}
	if err := sink.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	if n, err := src.Backlog(ctx); n != sent || err != nil {
		t.Fatalf("Backlog = %d, %v; want %d", n, err, sent)
	}
	// Received and acked: asked afresh, the count drops. (Not a message
	// in flight: local-aws-sqs counts those in ApproximateNumberOfMessages
	// too, where AWS counts only the available ones.)
	buf := make([]*ackwise.Message, 3)
	n, err := src.Receive(ctx, buf)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range buf[:n] {
		if err := src.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := src.Backlog(ctx); got != sent-n || err != nil {
		t.Fatalf("Backlog after %d acks = %d, %v; want %d", n, got, err, sent-n)
	}

	if _, err := c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(q)}); err != nil {
		t.Fatal(err)
	}
	n, err = src.Backlog(ctx)
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Backlog of a deleted queue = %d, %v; want an error saying it does not exist", n, err)
	}
}
