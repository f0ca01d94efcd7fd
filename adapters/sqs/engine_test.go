package sqs

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// TestEngineRetriesThroughVisibilityAndDeadLetters runs the consumer engine
// on an SQS source: a message failing transiently once is retried through
// the broker (a Nack to the policy's delay: a new receive, attempt 2, no
// sooner than the delay) and then acked; a poison message is handled
// MaxAttempts times, each a new receive, and dead-lettered with the
// envelope, its body byte for byte; the queue is empty afterwards.
func TestEngineRetriesThroughVisibilityAndDeadLetters(t *testing.T) {
	t.Parallel()
	const attempts, delay = 3, time.Second
	c := testClient(t)
	conn := testConn(t)
	q := createQueue(t, c, "engine", 10*time.Second, false)
	dq := createQueue(t, c, "engine-dlq", 0, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sink, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: conn})
	if err != nil {
		t.Fatal(err)
	}
	poison := &ackwise.Message{ID: "poison-" + randSuffix(), Payload: []byte{0xde, 0xad, 0, 0xbe, 0xef}, Headers: ackwise.HeadersOf("x-tenant", "acme")}
	flaky := &ackwise.Message{ID: "flaky-" + randSuffix(), Payload: []byte(`{"top-up":5}`)}
	if err := sink.Publish(ctx, poison, flaky); err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(ctx, Config{QueueURL: q, DeadLetterQueueURL: dq, Connection: conn, WaitTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()

	var mu sync.Mutex
	seen := map[string][]time.Time{}
	tries := map[string][]int{}
	flakyDone := make(chan struct{})
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		mu.Lock()
		defer mu.Unlock()
		seen[m.ID] = append(seen[m.ID], time.Now())
		tries[m.ID] = append(tries[m.ID], m.Attempt)
		switch {
		case m.ID == poison.ID:
			return errors.New("payment service says no")
		case m.Attempt == 1:
			return errors.New("payment service timed out")
		}
		close(flakyDone)
		return nil
	})
	fix := newCountFix()
	cons, err := consumer.New(fixedSource{src, fix}, h, consumer.Config{
		Name:  "billing",
		Retry: retry.Policy{MaxAttempts: attempts, InitialInterval: delay, Multiplier: 1, Jitter: retry.NoJitter},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cons.Run(runCtx) }()

	var dead []*ackwise.Message
	for len(dead) == 0 {
		if ctx.Err() != nil {
			t.Fatalf("no dead letter: handled %v", tries)
		}
		dead = drain(ctx, t, c, dq)
		time.Sleep(50 * time.Millisecond) // a queue offers nothing to wait on
	}
	<-flakyDone
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	for id, want := range map[string][]int{poison.ID: {1, 2, 3}, flaky.ID: {1, 2}} {
		if got := tries[id]; len(got) != len(want) || got[len(got)-1] != want[len(want)-1] {
			t.Errorf("%s handled at attempts %v, want %v", id, got, want)
		}
		for i := 1; i < len(seen[id]); i++ {
			if gap := seen[id][i].Sub(seen[id][i-1]); gap < delay-50*time.Millisecond {
				t.Errorf("%s: attempt %d came %v after the one before, want the broker's delay of %v", id, i+1, gap, delay)
			}
		}
	}
	if len(dead) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dead))
	}
	d := dead[0]
	env, err := dlq.Decode(d.Headers)
	switch {
	case err != nil:
		t.Fatal(err)
	case d.ID != poison.ID || !bytes.Equal(d.Payload, poison.Payload) || d.Headers.Get("x-tenant") != "acme":
		t.Errorf("dead letter %s %q %v, want %s %q with x-tenant", d.ID, d.Payload, d.Headers, poison.ID, poison.Payload)
	case env.Reason != dlq.ReasonMaxAttempts || env.Attempts != attempts || env.Consumer != "billing" || env.Source != queueName(q):
		t.Errorf("envelope %+v", env)
	case env.MessageID == "" || env.Error != "payment service says no" || !env.FirstFailure.Before(env.LastFailure):
		t.Errorf("envelope %+v", env)
	}
	// Each retry was a Nack (a visibility change), not a retry in place.
	fix.mu.Lock()
	if n := fix.cv[env.MessageID]; n != attempts-1 {
		t.Errorf("%d visibility changes of the poison message, want %d Nacks", n, attempts-1)
	}
	fix.mu.Unlock()
	// Nothing is left on the source queue, visible or in flight.
	out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(q), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll}})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed"} {
		if out.Attributes[k] != "0" {
			t.Errorf("%s = %s after the run, want 0", k, out.Attributes[k])
		}
	}
}
