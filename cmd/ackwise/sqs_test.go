package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/sqs/sqstest"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// sqsEndpoint is the SQS emulator sqstest started (or
// ACKWISE_SQS_ENDPOINT); "" under -short, where the SQS tests skip.
var sqsEndpoint string

func TestMain(m *testing.M) { sqstest.Main(m, &sqsEndpoint) }

// sqsQueues creates a work queue and its dead-letter queue on the
// emulator, deleted when t ends, and returns a raw client and the two
// queues' awssqs:// URLs, as sink URLs (a source URL adds sqsWait).
func sqsQueues(t *testing.T, ctx context.Context) (c *sqs.Client, work, dead string) {
	t.Helper()
	if sqsEndpoint == "" {
		t.Skip("needs the SQS emulator; -short runs offline tests only")
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c = sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(sqsEndpoint) })
	name := fmt.Sprintf("cli-%d-%d", time.Now().UnixNano(), seq.Add(1))
	var urls []string
	for _, q := range []string{name, name + "--dlq"} {
		out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(q)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl}) })
		u := strings.Replace(aws.ToString(out.QueueUrl), "http://", "awssqs://", 1)
		urls = append(urls, u+"?endpoint="+sqsEndpoint)
	}
	return c, urls[0], urls[1]
}

// sqsWait makes a source URL of an sqsQueues URL: long polls of 1s,
// shorter than the tests' -idle, which a long poll cancelled by the idle
// timeout would otherwise take.
const sqsWait = "&wait=1s"

// sqsDepth returns what queueURL (an awssqs:// URL) holds by SQS's count.
func sqsDepth(t *testing.T, ctx context.Context, queueURL string) int {
	t.Helper()
	src, err := adapters.OpenSource(ctx, queueURL)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	n, err := src.(dlq.Backlogger).Backlog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSQSStatsAndRedrive: the engine, on an SQS source whose handler fails
// permanently, dead-letters 300 messages into the dead-letter queue; the
// CLI inspects them, stats reports the queue's depth from SQS (300, every
// one sampled, nothing consumed) and fails on a queue that does not exist,
// and redrive moves all 300 back to the work queue, ending at the backlog:
// the work queue then holds the 300 events, whole and without envelope,
// and the dead-letter queue nothing.
func TestSQSStatsAndRedrive(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, work, dead := sqsQueues(t, ctx)
	publishEvents(t, ctx, work, "e")

	// The engine dead-letters every one (a permanent failure). It short
	// polls: a long poll that stopping the engine cancels would go on in
	// SQS for up to its wait and take messages the redrive below sends to
	// the work queue, invisible then for the visibility timeout (30s).
	deadQueue, _, _ := strings.Cut(dead, "?")
	deadQueue = deadQueue[strings.LastIndex(deadQueue, "/")+1:]
	src, err := adapters.OpenSource(ctx, work+"&wait=-1&dlq="+deadQueue)
	if err != nil {
		t.Fatal(err)
	}
	deadLetterAll(t, ctx, src, dead, consumer.Config{Name: "billing", Concurrency: 16})
	src.Close()
	if n := sqsDepth(t, ctx, work); n != 0 {
		t.Fatalf("the work queue holds %d messages after the run, want 0", n)
	}

	code, out, errOut := ackwiseRun(t, "dlq", "inspect", dead+sqsWait, "-n", "3", "--idle", "2s")
	if code != exitOK || len(lines(out)) != 3 || !strings.Contains(out, " reason=permanent class=permanent attempts=1 source=") {
		t.Fatalf("inspect: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = ackwiseRun(t, "dlq", "stats", dead+sqsWait, "-n", "300", "--idle", "2s")
	if code != exitOK || !strings.HasPrefix(out, "depth: 300 (the broker's count)\n") ||
		!strings.Contains(out, "sample: 300 messages (dead letters: 300, without envelope: 0)\n") ||
		!strings.Contains(out, "event IDs: 300 distinct (copies: 0;") || !strings.Contains(out, "  permanent ") {
		t.Fatalf("stats: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	missing := strings.Replace(dead, "-dlq?", "-missing?", 1)
	code, out, errOut = ackwiseRun(t, "dlq", "stats", missing+sqsWait, "--idle", "500ms")
	if code != exitFailed || out != "" || !strings.Contains(errOut, "not exist") {
		t.Fatalf("stats of a missing queue: exit %d, want %d\nstdout %s\nstderr %s", code, exitFailed, out, errOut)
	}

	// The run ends at what the dead-letter queue held as it started.
	code, out, errOut = ackwiseRun(t, "dlq", "redrive", "--yes", dead+sqsWait, work, "--rate", "-1", "--idle", "2s")
	if code != exitOK || !strings.HasPrefix(out, "moved 300 ") || !strings.Contains(out, "failed 0;") || !strings.Contains(out, "stopped: backlog (received the 300 messages") {
		t.Fatalf("redrive: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if n := sqsDepth(t, ctx, dead); n != 0 {
		t.Fatalf("the dead-letter queue holds %d messages after the redrive, want 0", n)
	}
	// The work queue holds each event once, as published, without envelope.
	expectRedriven(t, ctx, work, "e")
}
