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
// README.md beside this file shows how to watch it and redrive its dead
// letters.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	_ "github.com/ackwise/ackwise/adapters/rabbitmq" // registers amqp://
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/examples/internal/ops"
	"github.com/ackwise/ackwise/examples/internal/orders"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/retry"
)

// version goes into dead letters (ackwise-dlq-consumer-version): set it
// from the build, e.g. -ldflags "-X main.version=$(git describe)".
var version = "dev"

type options struct {
	broker       string // amqp://user:password@host:5672, no path
	queue        string
	queueType    string
	tiers        string
	attempts     int
	concurrency  int
	prefetch     int
	postgres     string
	schema       string
	sqlite       string
	addr         string
	traces       string
	logLevel     slog.Level
	drain        time.Duration
	demo         int
	work         time.Duration
	exitWhenDone bool

	// listening, when set, is told the HTTP server's address (tests).
	listening func(addr string)
}

func main() {
	var o options
	flag.StringVar(&o.broker, "amqp", envOr("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672"), "RabbitMQ `URL`, without a path (env AMQP_URL)")
	flag.StringVar(&o.queue, "queue", "orders", "work `queue`; its wait queues are QUEUE.wait.TIER, its dead-letter queue QUEUE.dlq")
	flag.StringVar(&o.queueType, "queue-type", "quorum", "`type` of every queue of the topology: quorum or classic")
	flag.StringVar(&o.tiers, "tiers", "1s,5s,30s", "retry delays, one wait queue `each` (whole milliseconds)")
	flag.IntVar(&o.attempts, "attempts", 5, "deliveries an order gets before it is dead-lettered (max-attempts)")
	flag.IntVar(&o.concurrency, "concurrency", 8, "handlers at once (one customer's orders one at a time)")
	flag.IntVar(&o.prefetch, "prefetch", 128, "RabbitMQ prefetch: at least the consumer's in-flight limit (concurrency × 16)")
	flag.StringVar(&o.postgres, "postgres", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL `DSN` of the inbox and shipments (env DATABASE_URL)")
	flag.StringVar(&o.schema, "schema", "orders_worker", "PostgreSQL `schema` of the tables (created if missing)")
	flag.StringVar(&o.sqlite, "sqlite", "", "use the SQLite `file` instead of PostgreSQL")
	flag.StringVar(&o.addr, "addr", "127.0.0.1:8080", "`address` of /healthz, /readyz and /metrics")
	flag.StringVar(&o.traces, "traces", ops.TracesNone, "where spans go: none or stdout")
	flag.TextVar(&o.logLevel, "log-level", slog.LevelInfo, "log `level`: debug, info, warn, error")
	flag.DurationVar(&o.drain, "drain", 25*time.Second, "on SIGTERM, how long running handlers get to finish")
	flag.IntVar(&o.demo, "demo", 0, "publish `N` demo orders first (every 4th fails twice, the last is poison)")
	flag.DurationVar(&o.work, "work", 0, "how long the fake warehouse call takes per order (demo)")
	flag.BoolVar(&o.exitWhenDone, "exit-when-done", false, "with -demo: drain and exit once every demo order is settled")
	flag.Parse()

	sum, err := run(context.Background(), o, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rabbitmq-worker:", err)
		os.Exit(1)
	}
	if o.demo > 0 {
		fmt.Println(sum)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// run runs the worker until ctx ends, SIGINT or SIGTERM, or (with
// exitWhenDone) the demo orders are settled. Traces go to stdout, logs to
// stderr (nil: discarded).
func run(ctx context.Context, o options, stdout, stderr io.Writer) (orders.Summary, error) {
	if o.demo < 0 || (o.exitWhenDone && o.demo == 0) {
		return orders.Summary{}, fmt.Errorf("-demo %d: want N ≥ 0, and N ≥ 1 with -exit-when-done", o.demo)
	}
	sourceURL, sinkURL, err := brokerURLs(o)
	if err != nil {
		return orders.Summary{}, err
	}
	tel, err := ops.NewTelemetry("rabbitmq-worker", o.traces, stdout, o.logLevel, stderr)
	if err != nil {
		return orders.Summary{}, err
	}
	defer func() { _ = tel.Shutdown(context.Background()) }()
	log := tel.Logger
	const name = "orders-worker" // the consumer: in dead letters, logs, metrics and inbox keys

	var store *orders.Store
	if o.sqlite != "" {
		store, err = orders.OpenSQLite(ctx, o.sqlite, name, log)
	} else {
		store, err = orders.OpenPostgres(ctx, o.postgres, o.schema, name, int32(o.concurrency+4), log)
	}
	if err != nil {
		return orders.Summary{}, fmt.Errorf("inbox: %w", err)
	}
	defer store.Close()
	pruneCtx, stopPrune := context.WithCancel(ctx)
	defer stopPrune()
	go func() {
		// Keep inbox records 14 days: longer than any retry, and than a
		// dead letter waits for its redrive (docs/idempotency.md).
		_ = store.PruneEvery(pruneCtx, time.Hour, 14*24*time.Hour, func(err error) {
			log.Warn("inbox prune failed", slog.Any(ackwise.LogKeyError, err))
		})
	}()

	// declare=true in the URL declares the queue, its wait queues and its
	// dead-letter queue before consuming, and after every reconnection.
	src, err := adapters.OpenSource(ctx, sourceURL, adapters.WithLogger(log), adapters.WithMeterProvider(tel.Meter), adapters.WithTracerProvider(tel.Tracer))
	if err != nil {
		return orders.Summary{}, err
	}
	defer src.Close() // after the Runner returned

	var demo []*ackwise.Message
	var prefix string
	if o.demo > 0 {
		prefix, demo = orders.Demo(o.demo)
	}
	metrics, err := consumer.NewMetrics(tel.Meter, name)
	if err != nil {
		return orders.Summary{}, err
	}
	tally := orders.NewTally(metrics, prefix, len(demo))
	c, err := consumer.New(src, store.Handler(o.work), consumer.Config{
		Name:        name,
		Version:     version,
		Concurrency: o.concurrency,
		// No schedule of its own: retries walk the source's tiers, one wait
		// queue per retry, the last repeating, until MaxAttempts.
		Retry:    retry.Policy{MaxAttempts: o.attempts},
		Inbox:    store.Inbox,
		Observer: tally,
		Middleware: []ackwise.Middleware{
			middleware.Tracing(tel.Tracer, middleware.TracingConfig{System: "rabbitmq"}), // first: the span covers the rest
			middleware.Logging(log),
			middleware.Timeout(30 * time.Second),
		},
		DrainTimeout: o.drain,
		Logger:       log,
	})
	if err != nil {
		return orders.Summary{}, err
	}
	runner, err := consumer.NewRunner(consumer.RunnerConfig{
		DrainTimeout: o.drain + 5*time.Second, // the consumer's drain and its grace
		Logger:       log,
		Metrics:      tel.Metrics,
	}, c)
	if err != nil {
		return orders.Summary{}, err
	}
	srv, err := ops.Serve(o.addr, runner.Handler(), log)
	if err != nil {
		return orders.Summary{}, err
	}
	defer srv.Close(context.Background())
	log.Info("serving /healthz, /readyz and /metrics", slog.String("addr", srv.Addr))
	if o.listening != nil {
		o.listening(srv.Addr)
	}

	if len(demo) > 0 {
		if err := publishDemo(ctx, sinkURL, tel, demo); err != nil {
			return orders.Summary{}, err
		}
		log.Info("published demo orders", slog.Int("count", len(demo)), slog.String(ackwise.LogKeyQueue, o.queue))
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	if o.exitWhenDone {
		go func() {
			select {
			case <-tally.Done():
				log.Info("every demo order is settled; draining")
				stop()
			case <-runCtx.Done():
			}
		}()
	}
	runErr := runner.Run(runCtx)
	sum := tally.Summary()
	if prefix != "" {
		sum.Shipped, sum.Shipments, err = store.Shipped(context.Background(), prefix)
	}
	sum.Absorbed = store.Duplicates()
	sum.IDPrefix = prefix
	return sum, errors.Join(runErr, err)
}

// brokerURLs returns the source URL (the topology declared, retry tiers,
// prefetch) and the sink URL of the work queue.
func brokerURLs(o options) (source, sink string, err error) {
	u, err := url.Parse(o.broker)
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

// publishDemo publishes msgs with confirms, in one producer span whose
// trace the consumer's spans continue (traceparent).
func publishDemo(ctx context.Context, sinkURL string, tel *ops.Telemetry, msgs []*ackwise.Message) error {
	sink, err := adapters.OpenSink(ctx, sinkURL, adapters.WithLogger(tel.Logger), adapters.WithTracerProvider(tel.Tracer))
	if err != nil {
		return err
	}
	defer sink.Close()
	pub, err := producer.New(sink, producer.Config{})
	if err != nil {
		return err
	}
	ctx, span := tel.Tracer.Tracer("rabbitmq-worker").Start(ctx, "publish demo orders", trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	return pub.Publish(ctx, msgs...)
}
