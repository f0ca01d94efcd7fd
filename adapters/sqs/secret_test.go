package sqs

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/ackwise/ackwise"
)

// TestErrorsShowNoCredentials: the errors of a source and a sink whose
// queue does not exist, or was deleted under them, do not show the secret
// key of the credentials the AWS chain gave.
func TestErrorsShowNoCredentials(t *testing.T) {
	t.Parallel()
	secret := os.Getenv("AWS_SECRET_ACCESS_KEY")
	c := testClient(t)
	conn := testConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var errs []error
	missing := "https://sqs.us-east-1.amazonaws.com/123456789012/missing-" + randSuffix()
	_, err := NewSource(ctx, Config{QueueURL: missing, Connection: conn})
	errs = append(errs, err)
	_, err = NewSink(ctx, SinkConfig{QueueURL: missing, Connection: conn})
	errs = append(errs, err)
	q := createQueue(t, c, "secret", 0, false)
	sink, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: conn})
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(ctx, Config{QueueURL: q, Connection: conn, WaitTime: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if _, err := c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(q)}); err != nil {
		t.Fatal(err)
	}
	errs = append(errs, sink.Publish(ctx, &ackwise.Message{ID: "a", Payload: []byte("a")}))
	_, err = src.Receive(ctx, make([]*ackwise.Message, 1))
	errs = append(errs, err)
	for i, err := range errs {
		if err == nil {
			t.Fatalf("call %d: no error", i)
		}
		if strings.Contains(err.Error(), secret) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("call %d: %v", i, err)
		}
	}
}
