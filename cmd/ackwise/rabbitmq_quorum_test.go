package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// TestRabbitMQQuorumRedriveStartsAtAttemptOne: on a quorum dead-letter queue
// every release (an inspect, a skipped or dry-run message) makes the broker
// add x-delivery-count to the next delivery. A redrive must not carry that
// broker header to the target, where the quorum source adds it to
// Message.Attempt: the redriven message must start again at attempt 1
// (docs/redrive.md).
func TestRabbitMQQuorumRedriveStartsAtAttemptOne(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ")
	}
	conn, queue := freshRabbitQueue(t, "ackwise-cli-quorum-")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	workURL := rabbitURL() + "/" + queue
	deadURL := rabbitURL() + "/" + queue + ".dlq?plain=true"

	src, err := adapters.OpenSource(ctx, workURL+"?declare=true&queue_type=quorum")
	if err != nil {
		t.Fatal(err)
	}
	sink, err := adapters.OpenSink(ctx, workURL)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if err := sink.Publish(ctx, &ackwise.Message{ID: "e0", Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	buf := make([]*ackwise.Message, 1)
	if _, err := src.Receive(ctx, buf); err != nil {
		t.Fatal(err)
	}
	if err := src.DeadLetter(ctx, buf[0], dlq.New(buf[0], dlq.ReasonMaxAttempts, errors.New("down"), ackwise.ClassTransient, time.Now(), "c", "")); err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	// Two inspections release the dead letter twice.
	for range 2 {
		if code, out, errOut := ackwiseRun(t, "dlq", "inspect", deadURL, "--idle", "300ms"); code != exitOK || len(lines(out)) != 1 {
			t.Fatalf("inspect: exit %d\n%s\n%s", code, out, errOut)
		}
	}
	// A quorum queue takes the last release back through its log after
	// the inspection returned: the redrive's count waits for it.
	ch := declareQueues(t, conn)
	waitRabbitReady(t, ch, queue+".dlq", 1)
	if code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", deadURL, workURL, "--rate", "-1", "--idle", "300ms"); code != exitOK || !strings.HasPrefix(out, "moved 1 ") {
		t.Fatalf("redrive: exit %d\n%s\n%s", code, out, errOut)
	}

	src, err = adapters.OpenSource(ctx, workURL+"?queue_type=quorum")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if _, err := src.Receive(ctx, buf); err != nil {
		t.Fatal(err)
	}
	m := buf[0]
	if m.ID != "e0" || m.Attempt != 1 {
		t.Errorf("redriven message: event ID %q, Attempt %d, headers %v; want e0 at attempt 1", m.ID, m.Attempt, m.Headers)
	}
	if err := src.Ack(ctx, m); err != nil {
		t.Fatal(err)
	}
}
