package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/rabbitmq"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// rabbitURL is the broker: ACKWISE_RABBITMQ_URL, else the local server every
// machine of this project runs.
func rabbitURL() string {
	if u := os.Getenv("ACKWISE_RABBITMQ_URL"); u != "" {
		return strings.TrimSuffix(u, "/")
	}
	return "amqp://guest:guest@127.0.0.1:5672"
}

// TestRabbitMQRoundTrip dead-letters messages through the RabbitMQ adapter's
// own DeadLetter, then inspects, dry-runs and redrives them with the CLI
// against the real broker, whose released deliveries are requeued at the
// head of the queue at once.
func TestRabbitMQRoundTrip(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ; -short runs offline tests only")
	}
	t.Parallel()
	conn, queue := freshRabbitQueue(t, "ackwise-cli-test-")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	workURL := rabbitURL() + "/" + queue
	deadURL := rabbitURL() + "/" + queue + ".dlq?plain=true"

	// Dead-letter four messages the way the engine does.
	src, err := adapters.OpenSource(ctx, workURL+"?declare=true")
	if err != nil {
		t.Fatal(err)
	}
	sink, err := adapters.OpenSink(ctx, workURL)
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte{0x00, 0xff, 0xc3, 0x28, '\n'}
	for i := range 4 {
		m := &ackwise.Message{ID: fmt.Sprint("e", i), Key: "k", Payload: payload, Headers: ackwise.HeadersOf("x-tenant", "acme")}
		if err := sink.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]*ackwise.Message, 4)
	for got := 0; got < 4; {
		n, err := src.Receive(ctx, buf[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	for i, m := range buf {
		reason := dlq.ReasonPermanent
		if i == 3 {
			reason = dlq.ReasonMaxAttempts
		}
		if err := src.DeadLetter(ctx, m, dlq.New(m, reason, errors.New("bad input"), ackwise.ClassPermanent, time.Now(), "billing", "v1")); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := ackwiseRun(t, "dlq", "inspect", deadURL, "--idle", "300ms")
	if code != exitOK || len(lines(out)) != 4 || !strings.HasPrefix(out, "e0 reason=permanent class=permanent attempts=1 source="+queue) {
		t.Fatalf("inspect: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if strings.Contains(out+errOut, "guest:guest") {
		t.Fatal("the password was printed")
	}
	// A dry run sees each message once although RabbitMQ requeues a
	// released message at once.
	code, out, errOut = ackwiseRun(t, "dlq", "redrive", "--yes", deadURL, workURL, "--dry-run", "--reason", "permanent", "--idle", "300ms")
	if code != exitOK || !strings.Contains(out, "would move 3 ") || !strings.Contains(out, "skipped 1 ") {
		t.Fatalf("dry run: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = ackwiseRun(t, "dlq", "redrive", "--yes", deadURL, workURL, "--reason", "permanent", "--rate", "-1", "--idle", "300ms")
	// The run ends at what the dead-letter queue held as it started
	// (the source's Backlog), not at the idle timeout.
	if code != exitOK || !strings.HasPrefix(out, "moved 3 ") || !strings.Contains(out, "skipped 1 ") || !strings.Contains(out, "stopped: backlog (received the 4 messages") {
		t.Fatalf("redrive: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}

	// The work queue holds the three, unchanged but for the envelope; the
	// dead-letter queue holds the fourth.
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	seen := map[string]bool{}
	for range 3 {
		d, ok, err := ch.Get(queue, true)
		if err != nil || !ok {
			t.Fatalf("work queue: get = %v, %v", ok, err)
		}
		id, _ := d.Headers[ackwise.HeaderEventID].(string)
		seen[id] = true
		if string(d.Body) != string(payload) || d.Headers["x-tenant"] != "acme" {
			t.Fatalf("redriven %s: body %x headers %v", id, d.Body, d.Headers)
		}
		for k := range d.Headers {
			if strings.HasPrefix(k, dlq.HeaderPrefix) || k == ackwise.HeaderAttempt {
				t.Fatalf("redriven %s kept header %s", id, k)
			}
		}
	}
	if !seen["e0"] || !seen["e1"] || !seen["e2"] {
		t.Fatalf("work queue held %v", seen)
	}
	q, err := ch.QueueDeclarePassive(queue+".dlq", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 1 {
		t.Fatalf("dead-letter queue holds %d messages, want 1", q.Messages)
	}
}

// freshRabbitQueue returns a connection to RabbitMQ and a unique queue name
// whose queues (the queue, its dead-letter queue and its wait queues) are
// deleted when t ends. It fails t when RabbitMQ cannot be reached.
func freshRabbitQueue(t *testing.T, prefix string) (*amqp.Connection, string) {
	t.Helper()
	conn, err := amqp.Dial(rabbitURL() + "/")
	if err != nil {
		t.Fatalf("RabbitMQ unreachable (start it with rabbitmq-server -detached): %v", errors.Unwrap(err))
	}
	t.Cleanup(func() { conn.Close() }) // after the queues are deleted
	var b [6]byte
	_, _ = rand.Read(b[:])
	queue := prefix + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		qs := []string{queue, queue + ".dlq"}
		for _, tier := range rabbitmq.TiersFor(retry.Policy{}) {
			qs = append(qs, rabbitmq.WaitQueueName(queue, tier))
		}
		for _, q := range qs {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(q, false, false, false)
				ch.Close()
			}
		}
	})
	return conn, queue
}

// declareQueues opens a channel on conn, closed when t ends, and declares
// the durable queues qs on it.
func declareQueues(t *testing.T, conn *amqp.Connection, qs ...string) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	for _, q := range qs {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	return ch
}
