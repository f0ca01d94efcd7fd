package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/rabbitmq"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/examples/internal/ops"
	"github.com/ackwise/ackwise/examples/internal/orders"
	"github.com/ackwise/ackwise/examples/internal/workertest"
)

// rabbitURL is the broker: ACKWISE_RABBITMQ_URL, else the machine's server.
func rabbitURL() string {
	if u := os.Getenv("ACKWISE_RABBITMQ_URL"); u != "" {
		return strings.TrimSuffix(u, "/")
	}
	return "amqp://guest:guest@127.0.0.1:5672"
}

var testTiers = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}

// setup returns options for a worker on a queue of the test's own (its
// topology deleted when the test ends) and a schema of its own, and a
// connection to the broker. It fails the test when RabbitMQ cannot be
// reached.
func setup(t *testing.T, demo int) (options, *amqp.Connection) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs RabbitMQ and PostgreSQL; -short runs offline tests only")
	}
	conn, err := amqp.Dial(rabbitURL() + "/")
	if err != nil {
		t.Fatalf("RabbitMQ unreachable (start it with rabbitmq-server -detached): %v", err)
	}
	queue := "ackwise-example-" + workertest.Suffix()
	t.Cleanup(func() {
		defer conn.Close()
		qs := []string{queue, queue + ".dlq"}
		for _, tier := range testTiers {
			qs = append(qs, rabbitmq.WaitQueueName(queue, tier))
		}
		for _, q := range qs {
			ch, err := conn.Channel()
			if err != nil {
				t.Errorf("delete %s: %v", q, err)
				return
			}
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("delete %s: %v", q, err)
			}
			ch.Close()
		}
	})
	return options{
		Options:   workertest.Options(t, demo),
		broker:    rabbitURL(),
		queue:     queue,
		queueType: "quorum",
		tiers:     "100ms,200ms",
		prefetch:  64,
	}, conn
}

// start starts the worker with o, its traces and logs written to the
// buffers (nil: discarded).
func start(t *testing.T, o options, traces, logs *workertest.Buffer) *workertest.Worker {
	t.Helper()
	return workertest.Start(t, func(ctx context.Context, listening func(string)) (orders.Summary, error) {
		o.Listening = listening
		return run(ctx, o, traces.Writer(), logs.Writer())
	})
}

// depth is the number of ready messages in queue.
func depth(t *testing.T, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("queue %s: %v", queue, err)
	}
	return q.Messages
}

// TestWorkerEndToEnd runs the worker with 12 demo orders on the real
// RabbitMQ and PostgreSQL: while it runs /readyz is 200 and /metrics
// serves ackwise's instruments; the flaky orders are retried through the
// wait queues, the poison order lands in the dead-letter queue byte for
// byte with its envelope, every other order ships once; logs are JSON and
// the consumer's spans continue the producer's trace.
func TestWorkerEndToEnd(t *testing.T) {
	t.Parallel()
	o, conn := setup(t, 12)
	o.Traces = ops.TracesStdout
	var traces, logs workertest.Buffer
	sum, _ := workertest.RunDemo(t, start(t, o, &traces, &logs), 12)

	// The poison order is in the dead-letter queue, as published, with
	// its envelope.
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	d, ok, err := ch.Get(o.queue+".dlq", true)
	if err != nil || !ok {
		t.Fatalf("dead-letter queue: get = %v, %v", ok, err)
	}
	poison := sum.IDPrefix + "0011"
	if string(d.Body) != `{"id": "`+poison+`", "cents": "lots"` || d.Headers[ackwise.HeaderEventID] != poison ||
		d.Headers[dlq.HeaderReason] != string(dlq.ReasonPermanent) || d.Headers[dlq.HeaderConsumer] != "orders-worker" {
		t.Fatalf("dead letter: body %q headers %v", d.Body, d.Headers)
	}
	// The topology was declared: the wait queues the retries went
	// through are there, empty now.
	n := depth(t, conn, o.queue+".dlq") + depth(t, conn, o.queue)
	for _, tier := range testTiers {
		n += depth(t, conn, rabbitmq.WaitQueueName(o.queue, tier))
	}
	if n != 0 {
		t.Fatalf("%d messages left in the queues", n)
	}

	workertest.CheckLogs(t, &logs, poison)
	// 12 orders, 4 retries: 16 handler runs, each in the producer's trace.
	workertest.CheckTraces(t, &traces, "process "+o.queue, 16)
}

// TestWorkerDrainsOnSIGTERM: SIGTERM while orders are being handled drains
// the worker: handlers running finish and their orders are acked, run
// returns nil, and the orders not handled stay in the broker. A restarted
// worker handles them: every order ships exactly once, the poison one is
// dead-lettered. (Not parallel: SIGTERM goes to the whole test process.)
func TestWorkerDrainsOnSIGTERM(t *testing.T) {
	o, conn := setup(t, 30)
	workertest.CheckDrainAndRestart(t, o.Schema, func(demo int, work time.Duration, concurrency int) *workertest.Worker {
		o := o
		o.Demo, o.Work, o.Concurrency = demo, work, concurrency
		return start(t, o, nil, nil)
	})
	if n := depth(t, conn, o.queue+".dlq"); n != 1 {
		t.Fatalf("dead-letter queue holds %d, want 1", n)
	}
}

// TestWorkerSQLiteExitsWhenDone: with -sqlite and -exit-when-done, the
// worker needs no PostgreSQL, and returns by itself once the demo orders
// are settled.
func TestWorkerSQLiteExitsWhenDone(t *testing.T) {
	t.Parallel()
	o, _ := setup(t, 5)
	o.SQLite = filepath.Join(t.TempDir(), "worker.db")
	o.ExitWhenDone = true
	workertest.CheckExitsWhenDone(t, o.Demo, func(ctx context.Context) (orders.Summary, error) { return run(ctx, o, nil, nil) })
}

// TestRunRejectsABrokerURLWithAQueue: -amqp names the broker, -queue the
// queue; the error does not show the password.
func TestRunRejectsABrokerURLWithAQueue(t *testing.T) {
	t.Parallel()
	_, err := run(t.Context(), options{broker: "amqp://guest:secret@127.0.0.1:5672/orders"}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "the queue is -queue") || strings.Contains(err.Error(), "secret") {
		t.Fatalf("run = %v, want an error saying the queue is -queue, without the password", err)
	}
}
