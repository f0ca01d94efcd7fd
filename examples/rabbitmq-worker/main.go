// Command rabbitmq-worker is a production-shaped ackwise worker on
// RabbitMQ: a team can copy it and replace the order handling with its own.
//
//   - Topology: the work queue, one wait queue per retry tier and the
//     dead-letter queue, declared at start (quorum queues by default).
//   - Exactly-once effects: the idempotency inbox on PostgreSQL (pginbox),
//     committed with the shipment; -sqlite uses a SQLite file instead.
//   - Retries through the broker's wait queues (-tiers), then the
//     dead-letter queue with the full context in headers.
//   - Metrics (OpenTelemetry, exported to Prometheus) at /metrics, the
//     probes /healthz and /readyz, on -addr; traces to stdout with
//     -traces=stdout; JSON logs on stderr.
//   - consumer.Runner: SIGINT or SIGTERM drains (running handlers finish
//     and are acked, the rest stays in the queue for the next process).
//
// With -demo N it first publishes N demo orders: every fourth fails twice
// (the warehouse is down) and is retried through the wait queues, and the
// last is poison and is dead-lettered. With -exit-when-done it drains and
// exits once they are all settled, and prints what became of them:
//
//	go run ./examples/rabbitmq-worker -demo 20 -exit-when-done
//	orders=20 acked=19 dead_lettered=1 retried=8 shipped=19 double_shipped=0 duplicates_absorbed=0
//
// This file holds what is particular to RabbitMQ (flags, URLs, topology);
// the service around the consumer is examples/internal/worker, the order
// handling examples/internal/orders. README.md beside this file shows how
// to watch the worker and redrive its dead letters.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"

	_ "github.com/ackwise/ackwise/adapters/rabbitmq" // registers amqp://
	"github.com/ackwise/ackwise/examples/internal/orders"
	"github.com/ackwise/ackwise/examples/internal/worker"
)

type options struct {
	worker.Options
	broker    string // amqp://user:password@host:5672, no path
	queue     string
	queueType string
	tiers     string
	prefetch  int
}

func main() {
	var o options
	o.Flags(flag.CommandLine)
	flag.StringVar(&o.broker, "amqp", "", "RabbitMQ `URL`, without a path (default: $AMQP_URL, else "+defaultBroker+")")
	flag.StringVar(&o.queue, "queue", "orders", "work `queue`; its wait queues are QUEUE.wait.TIER, its dead-letter queue QUEUE.dlq")
	flag.StringVar(&o.queueType, "queue-type", "quorum", "`type` of every queue of the topology: quorum or classic")
	flag.StringVar(&o.tiers, "tiers", "1s,5s,30s", "retry delays, one wait queue `each` (whole milliseconds)")
	flag.IntVar(&o.prefetch, "prefetch", 128, "RabbitMQ prefetch: at least the consumer's in-flight limit (concurrency × 16)")
	flag.Parse()

	sum, err := run(context.Background(), o, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rabbitmq-worker:", err)
		os.Exit(1)
	}
	if o.Demo > 0 {
		fmt.Println(sum)
	}
}

const defaultBroker = "amqp://guest:guest@127.0.0.1:5672"

// run runs the worker (worker.Run) on the RabbitMQ queue o names.
func run(ctx context.Context, o options, stdout, stderr io.Writer) (orders.Summary, error) {
	source, sink, err := brokerURLs(o)
	if err != nil {
		return orders.Summary{}, err
	}
	return worker.Run(ctx, o.Options, worker.Broker{
		Service:     "rabbitmq-worker",
		System:      "rabbitmq",
		SourceURL:   source,
		SinkURL:     sink,
		SourceMeter: true, // consumer_timeout warnings
	}, stdout, stderr)
}

// brokerURLs returns the source URL of the work queue and the sink URL
// the demo orders are published to. The source declares the topology
// (declare=true) before it consumes, and again after every reconnection:
// the work queue, one wait queue per tier, and the dead-letter queue.
func brokerURLs(o options) (source, sink string, err error) {
	u, err := url.Parse(cmp.Or(o.broker, worker.Env("AMQP_URL", defaultBroker)))
	if err != nil {
		return "", "", fmt.Errorf("-amqp: %w", errors.Unwrap(err))
	}
	if strings.Trim(u.Path, "/") != "" || u.RawQuery != "" {
		return "", "", fmt.Errorf("-amqp %s: give the broker only (amqp://user:password@host:5672): the queue is -queue", u.Redacted())
	}
	u.Path = "/" + o.queue
	sink = u.String()
	u.RawQuery = url.Values{
		"declare":    {"true"},
		"queue_type": {o.queueType},
		"tiers":      {o.tiers},
		"prefetch":   {strconv.Itoa(o.prefetch)},
	}.Encode()
	return u.String(), sink, nil
}
