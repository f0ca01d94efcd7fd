package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/rabbitmq"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/examples/internal/ops"
	"github.com/ackwise/ackwise/examples/internal/orders"
	"github.com/ackwise/ackwise/examples/internal/worker"
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
	_, schema := workertest.Schema(t)
	return options{
		Options: worker.Options{
			Attempts:    4,
			Concurrency: 4,
			Postgres:    workertest.PostgresURL(),
			Schema:      schema,
			Addr:        "127.0.0.1:0",
			Traces:      ops.TracesNone,
			Drain:       10 * time.Second,
			Demo:        demo,
		},
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
	w := start(t, o, &traces, &logs)
	workertest.AwaitStatus(t, w.Base+"/readyz", http.StatusOK)
	out, scrape := workertest.AwaitOutcomes(t, w.Base+"/metrics", func(out map[string]float64) bool {
		return out["acked"] == 11 && out["dead-lettered"] == 1
	})
	// Orders 3 and 7 fail twice each (11, also a fourth, is the poison).
	if out["retried"] != 4 {
		t.Errorf("retried = %v, want 4", out["retried"])
	}
	for _, want := range []string{"ackwise_consumer_handler_duration_seconds_bucket", "ackwise_consumer_redeliveries_total", "go_goroutines", `ackwise_consumer_name="orders-worker"`} {
		if !strings.Contains(scrape, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if code, body := workertest.Get(t, w.Base+"/healthz"); code != http.StatusOK || !strings.HasPrefix(body, "running\n") {
		t.Errorf("/healthz = %d %q", code, body)
	}
	w.Cancel()
	r := w.Wait(t)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	sum := r.Summary
	t.Log(sum)
	if want := (orders.Summary{Orders: 12, Acked: 11, DeadLettered: 1, Retried: 4, Shipped: 11, Shipments: 11, IDPrefix: sum.IDPrefix}); sum != want {
		t.Fatalf("summary %v, want %v", sum, want)
	}

	// The poison order is in the dead-letter queue, as published, with
	// its envelope; nothing is left in the work queue.
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
	if n := depth(t, conn, o.queue+".dlq") + depth(t, conn, o.queue); n != 0 {
		t.Fatalf("%d messages left in the work and dead-letter queues", n)
	}

	// JSON logs: the dead letter is there, with its event ID.
	found := false
	for _, l := range logs.JSONLines(t) {
		if l["msg"] == "dead-lettered" && l[ackwise.LogKeyEventID] == poison && l[ackwise.LogKeyReason] == "permanent" {
			found = true
		}
	}
	if !found {
		t.Error("no JSON log record of the dead letter")
	}
	// Traces: each order's consumer span is a child of the demo's
	// producer span, in its trace.
	var producerTrace string
	processed := 0
	spans := traces.JSONLines(t)
	for _, s := range spans {
		if s["Name"] == "publish demo orders" {
			producerTrace = s["SpanContext"].(map[string]any)["TraceID"].(string)
		}
	}
	for _, s := range spans {
		if s["Name"] == "process "+o.queue && s["Parent"].(map[string]any)["TraceID"] == producerTrace {
			processed++
		}
	}
	// 12 orders, 4 retries: 16 handler runs.
	if producerTrace == "" || processed != 16 {
		t.Fatalf("%d spans; %d handler spans in the producer's trace %q, want 16", len(spans), processed, producerTrace)
	}
}

// TestWorkerDrainsOnSIGTERM: SIGTERM while orders are being handled drains
// the worker: handlers running finish and their orders are acked, run
// returns nil, and the orders not handled stay in the broker. A restarted
// worker handles them: every order ships exactly once, the poison one is
// dead-lettered. (Not parallel: SIGTERM goes to the whole test process.)
func TestWorkerDrainsOnSIGTERM(t *testing.T) {
	o, conn := setup(t, 30)
	o.Work = 50 * time.Millisecond // 30 orders, 2 at a time: at least 750ms of work
	o.Concurrency = 2
	w := start(t, o, nil, nil)
	workertest.AwaitStatus(t, w.Base+"/readyz", http.StatusOK)
	workertest.AwaitOutcomes(t, w.Base+"/metrics", func(out map[string]float64) bool { return out["acked"] > 0 })
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r := w.Wait(t)
	if r.Err != nil {
		t.Fatalf("run after SIGTERM = %v, want nil (drained)", r.Err)
	}
	first := r.Summary
	t.Log("first worker:", first)
	// A first worker that handled everything before SIGTERM took effect
	// would leave nothing to drain: at 2 orders per 50ms, it cannot.
	if first.Acked+first.DeadLettered >= 30 || first.Shipments != first.Shipped || first.Shipped != first.Acked {
		t.Fatalf("first worker: %v; want some orders left, each acked order shipped once", first)
	}

	// A second worker, as after a restart, finishes the rest.
	o.Demo = 0
	o.Work = 0
	w = start(t, o, nil, nil)
	workertest.AwaitOutcomes(t, w.Base+"/metrics", func(out map[string]float64) bool {
		return first.Acked+int(out["acked"]) >= 29 && first.DeadLettered+int(out["dead-lettered"]) >= 1
	})
	w.Cancel()
	if r := w.Wait(t); r.Err != nil {
		t.Fatal(r.Err)
	}
	store, err := orders.OpenPostgres(t.Context(), o.Postgres, o.Schema, worker.Name, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	shipped, rows, err := store.Shipped(t.Context(), first.IDPrefix)
	if err != nil || shipped != 29 || rows != 29 {
		t.Fatalf("shipped %d orders in %d rows (%v); want 29 in 29", shipped, rows, err)
	}
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
	ctx, cancel := context.WithTimeout(t.Context(), workertest.Wait)
	defer cancel()
	sum, err := run(ctx, o, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := (orders.Summary{Orders: 5, Acked: 4, DeadLettered: 1, Retried: 2, Shipped: 4, Shipments: 4, IDPrefix: sum.IDPrefix}); sum != want {
		t.Fatalf("summary %v, want %v", sum, want)
	}
	if ctx.Err() != nil {
		t.Fatal("run returned only when the test's deadline passed")
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		o    options
		want string
	}{
		{options{Options: worker.Options{Demo: -1}}, "-demo -1"},
		{options{Options: worker.Options{ExitWhenDone: true}}, "-exit-when-done"},
		{options{broker: "amqp://guest:secret@127.0.0.1:5672/orders"}, "the queue is -queue"},
	} {
		_, err := run(t.Context(), tc.o, nil, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("run(%+v) = %v, want an error saying %q without the password", tc.o, err, tc.want)
		}
	}
}
