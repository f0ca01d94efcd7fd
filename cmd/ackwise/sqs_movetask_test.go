package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// queueURLOf returns the SQS queue URL of an sqsQueues URL.
func queueURLOf(u string) string {
	u, _, _ = strings.Cut(u, "?")
	return strings.Replace(u, "awssqs://", "http://", 1)
}

// TestSQSNativeRedriveNotStarted: a move task that cannot start (the
// dead-letter queue does not exist) exits 1 and its summary states the
// rate asked for, not "SQS's choice".
func TestSQSNativeRedriveNotStarted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	_, work, dead := sqsQueues(t, ctx)
	base, query, _ := strings.Cut(dead, "?")
	missing := base + "-missing?" + query
	code, out, errOut := ackwiseRun(t, "dlq", "redrive", missing, work, "--native", "--rate", "50", "--yes")
	if code != exitFailed || !strings.Contains(out, "(status not started, rate 50/s asked)") {
		t.Fatalf("redrive --native from a missing queue: exit %d, want %d\nstdout %s\nstderr %s", code, exitFailed, out, errOut)
	}
}

// TestSQSNativeRedrive: the engine on a work queue with broker-managed
// dead letters (dlq_mode=broker, maxReceiveCount 1) hands 300 messages
// back, and SQS's RedrivePolicy moves them to the dead-letter queue;
// `ackwise dlq redrive -native -rate 100` moves them back with SQS's move
// task, reporting 300 moved at 100/s, and the work queue then holds each
// event once, as published (without envelope: SQS moved them as they
// were). Flags -native does not take, a rate it cannot pass and a URL that
// is not SQS's are usage errors.
func TestSQSNativeRedrive(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, work, dead := sqsQueues(t, ctx)
	arn, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queueURLOf(dead)), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	policy := fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":1}`, arn.Attributes["QueueArn"])
	if _, err := c.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{QueueUrl: aws.String(queueURLOf(work)), Attributes: map[string]string{"RedrivePolicy": policy}}); err != nil {
		t.Fatal(err)
	}

	for _, u := range []struct {
		args []string
		want string
	}{
		{[]string{dead, work, "-native", "-dry-run"}, "-native takes only -rate"},
		{[]string{dead, work, "-native", "-max", "5", "-reason", "permanent"}, "(-max, -reason not taken)"},
		{[]string{dead, work, "-native", "-rate", "2.5"}, "want whole messages a second from 1 to 500"},
		{[]string{dead, work, "-native", "-rate", "501"}, "-rate = 501"},
		{[]string{"mem://cli-work.dlq", "mem://cli-work", "-native"}, "is not an awssqs:// URL"},
	} {
		code, out, errOut := ackwiseRun(t, append([]string{"dlq", "redrive"}, u.args...)...)
		if code != exitUsage || out != "" || !strings.Contains(errOut, u.want) {
			t.Errorf("redrive %v: exit %d, want %d saying %q\nstdout %s\nstderr %s", u.args, code, exitUsage, u.want, out, errOut)
		}
	}

	publishEvents(t, ctx, work, "n")
	src, err := adapters.OpenSource(ctx, work+"&wait=-1&dlq_mode=broker&max_attempts=1")
	if err != nil {
		t.Fatal(err)
	}
	deadLetterAll(t, ctx, src, dead, consumer.Config{Name: "billing", Concurrency: 16, Retry: retry.Policy{MaxAttempts: 1}})
	src.Close()

	code, out, errOut := ackwiseRun(t, "dlq", "redrive", dead, work, "-native", "-rate", "100", "--yes")
	if code != exitOK || !strings.Contains(out, "\nmoved 300 from ") || !strings.Contains(out, "(status COMPLETED, rate 100/s)") || !strings.HasPrefix(out, "moving: ") {
		t.Fatalf("redrive -native: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if n := sqsDepth(t, ctx, dead); n != 0 {
		t.Fatalf("the dead-letter queue holds %d messages after the move, want 0", n)
	}
	expectRedriven(t, ctx, work, "n")
}

// publishEvents publishes deadLetters events prefix0, prefix1, … to the
// queue work (an awssqs:// URL), as expectRedriven expects them.
func publishEvents(t *testing.T, ctx context.Context, work, prefix string) {
	t.Helper()
	sink, err := adapters.OpenSink(ctx, work)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	msgs := make([]*ackwise.Message, deadLetters)
	for i := range msgs {
		msgs[i] = &ackwise.Message{ID: fmt.Sprint(prefix, i), Key: "k", Payload: []byte(fmt.Sprint("payload-", i)), Headers: ackwise.HeadersOf("x-tenant", "acme")}
	}
	if err := sink.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
}

// deadLetterAll runs the engine on src, with a handler failing every
// message permanently, until the dead-letter queue dead (an awssqs:// URL)
// holds deadLetters messages.
func deadLetterAll(t *testing.T, ctx context.Context, src adapters.Source, dead string, cfg consumer.Config) {
	t.Helper()
	var handled atomic.Int64
	cons, err := consumer.New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		handled.Add(1)
		return ackwise.Permanent(errors.New("bad input"))
	}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cons.Run(runCtx) }()
	// A queue offers nothing to wait on: poll the dead-letter queue.
	for sqsDepth(t, ctx, dead) < deadLetters {
		if ctx.Err() != nil {
			t.Fatalf("%d dead letters, want %d (handled %d)", sqsDepth(t, context.Background(), dead), deadLetters, handled.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// expectRedriven receives the work queue (an awssqs:// URL) dry and checks
// that it held the deadLetters events prefix0, prefix1, … once each, as
// published (payload-N, key k, x-tenant acme) and without envelope.
func expectRedriven(t *testing.T, ctx context.Context, work, prefix string) {
	t.Helper()
	back, err := adapters.OpenSource(ctx, work+sqsWait+"&ack_linger=-1")
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	receiveRedriven(t, ctx, back, prefix, deadLetters, func(*ackwise.Message) bool { return true })
	if n := sqsDepth(t, ctx, work); n != 0 {
		t.Fatalf("the work queue holds %d more messages than the %d redriven", n, deadLetters)
	}
}
