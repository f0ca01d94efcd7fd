package sqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
)

// testConn is the connection to the test endpoint.
func testConn(t testing.TB) Connection {
	return Connection{Endpoint: needSQS(t)}
}

// testClient returns a raw SQS client on the test endpoint, the witness
// the tests read and arrange queues with.
func testClient(t testing.TB) *sqs.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := testConn(t).newClient(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func randSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// createQueue creates a queue named prefix-<random> (".fifo" added when
// fifo) with a visibility timeout of lease (rounded up to whole seconds;
// 0: 30s), deletes it when t ends, and returns its URL.
func createQueue(t testing.TB, c *sqs.Client, prefix string, lease time.Duration, fifo bool) string {
	t.Helper()
	secs := 30
	if lease > 0 {
		secs = int((lease + time.Second - 1) / time.Second)
	}
	name := prefix + "-" + randSuffix()
	attrs := map[string]string{"VisibilityTimeout": strconv.Itoa(secs)}
	if fifo {
		name += ".fifo"
		attrs["FifoQueue"] = "true"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("create queue %s: %v", name, err)
	}
	url := aws.ToString(out.QueueUrl)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
		if _, gone := errors.AsType[*types.QueueDoesNotExist](err); err != nil && !gone {
			t.Logf("delete queue %s: %v", name, err)
		}
	})
	return url
}

// drain receives and deletes what queueURL holds now, decoded as a Source
// decodes a delivery, without long polling.
func drain(ctx context.Context, t testing.TB, c *sqs.Client, queueURL string) []*ackwise.Message {
	t.Helper()
	dec := &Source{name: queueName(queueURL), fifo: isFIFO(queueURL), lease: time.Minute}
	var out []*ackwise.Message
	for {
		res, err := c.ReceiveMessage(ctx, &awsReceive(queueURL).ReceiveMessageInput)
		if err != nil {
			t.Fatalf("receive from %s: %v", queueName(queueURL), err)
		}
		if len(res.Messages) == 0 {
			return out
		}
		for _, m := range res.Messages {
			msg := dec.message(m, 0)
			msg.Handle = nil
			out = append(out, msg)
			if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatalf("delete from %s: %v", queueName(queueURL), err)
			}
		}
	}
}

// rawReceive is a ReceiveMessage of every attribute, without long polling.
type rawReceive struct{ sqs.ReceiveMessageInput }

func awsReceive(queueURL string) *rawReceive {
	return &rawReceive{sqs.ReceiveMessageInput{
		QueueUrl:              aws.String(queueURL),
		MaxNumberOfMessages:   10,
		AttributeNames:        []types.QueueAttributeName{types.QueueAttributeNameAll},
		MessageAttributeNames: []string{"All"},
	}}
}

// startConsumer runs cons until the returned stop is called, which
// cancels it, waits for Run and fails t if Run failed. Defer stop after
// deferring the source's Close: the consumer stops first.
func startConsumer(ctx context.Context, t testing.TB, cons *consumer.Consumer) (stop func()) {
	t.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cons.Run(runCtx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	return stop
}
