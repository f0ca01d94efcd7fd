// Package worker is the service skeleton the worker examples share
// (examples/rabbitmq-worker, examples/kafka-worker): given a source and a
// sink URL, it runs the order consumer the way a production service does:
// the idempotency inbox, retries through the broker's tiers, dead letters,
// metrics to Prometheus, traces, JSON logs, a consumer.Runner with its
// probes, and a drain on SIGINT or SIGTERM. Each example's main.go adds
// what is particular to its broker (its flags, URLs and topology).
package worker

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/examples/internal/ops"
	"github.com/ackwise/ackwise/examples/internal/orders"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/retry"
)

// Name is the consumer's name: in dead letters (ackwise-dlq-consumer),
// logs, metrics (ackwise.consumer.name) and inbox keys.
const Name = "orders-worker"

// Options are the settings both examples take from their flags.
type Options struct {
	Attempts     int
	Concurrency  int
	Postgres     string
	Schema       string
	SQLite       string
	Addr         string
	Traces       string
	LogLevel     slog.Level
	Drain        time.Duration
	Demo         int
	Work         time.Duration
	ExitWhenDone bool
	// Version goes into dead letters (ackwise-dlq-consumer-version).
	Version string

	// Listening, when set, is told the HTTP server's address (tests).
	Listening func(addr string)
}

// Flags registers the options' flags on fs, with their defaults.
func (o *Options) Flags(fs *flag.FlagSet) {
	fs.IntVar(&o.Attempts, "attempts", 5, "deliveries an order gets before it is dead-lettered (max-attempts)")
	fs.IntVar(&o.Concurrency, "concurrency", 8, "handlers at once (one customer's orders one at a time)")
	fs.StringVar(&o.Postgres, "postgres", "", "PostgreSQL `DSN` of the inbox and shipments (default: $DATABASE_URL, else "+DefaultPostgres+")")
	fs.StringVar(&o.Schema, "schema", "orders_worker", "PostgreSQL `schema` of the tables (created if missing)")
	fs.StringVar(&o.SQLite, "sqlite", "", "use the SQLite `file` instead of PostgreSQL")
	fs.StringVar(&o.Addr, "addr", "127.0.0.1:8080", "`address` of /healthz, /readyz and /metrics")
	fs.StringVar(&o.Traces, "traces", ops.TracesNone, "where spans go: none or stdout")
	fs.TextVar(&o.LogLevel, "log-level", slog.LevelInfo, "log `level`: debug, info, warn, error")
	fs.DurationVar(&o.Drain, "drain", 25*time.Second, "on SIGTERM, how long running handlers get to finish")
	fs.IntVar(&o.Demo, "demo", 0, "publish `N` demo orders first (every 4th fails twice, the last is poison)")
	fs.DurationVar(&o.Work, "work", 0, "how long the fake warehouse call takes per order (demo)")
	fs.BoolVar(&o.ExitWhenDone, "exit-when-done", false, "with -demo: drain and exit once every demo order is settled")
	fs.StringVar(&o.Version, "consumer-version", "dev", "the worker's `version`, written into its dead letters (ackwise-dlq-consumer-version)")
}

// Check validates the options that Flags cannot.
func (o Options) Check() error {
	if o.Demo < 0 || (o.ExitWhenDone && o.Demo == 0) {
		return fmt.Errorf("-demo %d: want N ≥ 0, and N ≥ 1 with -exit-when-done", o.Demo)
	}
	return nil
}

// DefaultPostgres is the database used when neither -postgres nor
// DATABASE_URL names one.
const DefaultPostgres = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// Env returns the value of the environment variable key, else def. Flags
// whose value may hold a password take it at run time, not as their
// default, which -h would print.
func Env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Broker is what an example tells Run about its broker.
type Broker struct {
	// Service names the service in traces and metrics (service.name).
	Service string
	// System is the messaging.system of the consumer spans.
	System string
	// SourceURL is the work queue or topic to consume, with its retry
	// tiers; SinkURL where the demo orders are published.
	SourceURL, SinkURL string
	// SourceMeter says whether the source takes a meter provider
	// (adapters.WithMeterProvider) for metrics of its own.
	SourceMeter bool
}

// Run runs the worker until ctx ends, SIGINT or SIGTERM, or (with
// ExitWhenDone) the demo orders are settled, then drains. Traces go to
// stdout, logs to stderr (nil: discarded). The summary is of the demo
// orders (zero without -demo).
func Run(ctx context.Context, o Options, b Broker, stdout, stderr io.Writer) (orders.Summary, error) {
	if err := o.Check(); err != nil {
		return orders.Summary{}, err
	}
	tel, err := ops.NewTelemetry(b.Service, o.Traces, stdout, o.LogLevel, stderr)
	if err != nil {
		return orders.Summary{}, err
	}
	defer func() { _ = tel.Shutdown(context.Background()) }()
	log := tel.Logger

	var store *orders.Store
	if o.SQLite != "" {
		store, err = orders.OpenSQLite(ctx, o.SQLite, Name, log, tel.Meter)
	} else {
		dsn := cmp.Or(o.Postgres, Env("DATABASE_URL", DefaultPostgres))
		store, err = orders.OpenPostgres(ctx, dsn, o.Schema, Name, int32(o.Concurrency+4), log, tel.Meter)
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

	opts := []adapters.OpenOption{adapters.WithLogger(log), adapters.WithTracerProvider(tel.Tracer)}
	if b.SourceMeter {
		opts = append(opts, adapters.WithMeterProvider(tel.Meter))
	}
	src, err := adapters.OpenSource(ctx, b.SourceURL, opts...)
	if err != nil {
		return orders.Summary{}, err
	}
	defer src.Close() // after the Runner returned

	var demo []*ackwise.Message
	var prefix string
	if o.Demo > 0 {
		prefix, demo = orders.Demo(o.Demo)
	}
	metrics, err := consumer.NewMetrics(tel.Meter, Name)
	if err != nil {
		return orders.Summary{}, err
	}
	tally := orders.NewTally(metrics, prefix, len(demo))
	// The consumer exports its gauges (lag age, in flight, waiting) only
	// when its Observer is NewMetrics' own: a wrapping Observer, as the
	// demo's tally is, passes the outcome counters on and nothing else.
	// So the tally observes only a demo run.
	observer := metrics
	if len(demo) > 0 {
		observer = tally
	}
	c, err := consumer.New(src, store.Handler(o.Work), consumer.Config{
		Name:        Name,
		Version:     o.Version,
		Concurrency: o.Concurrency,
		// No schedule of its own: retries walk the source's tiers, one
		// retry topic or wait queue per retry, the last repeating, until
		// MaxAttempts; then the dead-letter queue or topic.
		Retry:    retry.Policy{MaxAttempts: o.Attempts},
		Inbox:    store.Inbox,
		Observer: observer,
		Middleware: []ackwise.Middleware{
			middleware.Tracing(tel.Tracer, middleware.TracingConfig{System: b.System}), // first: its span covers the rest
			middleware.Logging(log),
			middleware.Timeout(30 * time.Second),
		},
		DrainTimeout: o.Drain,
		Logger:       log,
	})
	if err != nil {
		return orders.Summary{}, err
	}
	runner, err := consumer.NewRunner(consumer.RunnerConfig{
		DrainTimeout: o.Drain + 5*time.Second, // the consumer's drain and its grace
		Logger:       log,
		Metrics:      tel.Metrics,
	}, c)
	if err != nil {
		return orders.Summary{}, err
	}
	srv, err := ops.Serve(o.Addr, runner.Handler(), log)
	if err != nil {
		return orders.Summary{}, err
	}
	defer srv.Close(context.Background())
	log.Info("serving /healthz, /readyz and /metrics", slog.String("addr", srv.Addr))
	if o.Listening != nil {
		o.Listening(srv.Addr)
	}

	if len(demo) > 0 {
		if err := publish(ctx, b, tel, demo); err != nil {
			return orders.Summary{}, fmt.Errorf("publish the demo orders: %w", err)
		}
		log.Info("published demo orders", slog.Int("count", len(demo)))
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	if o.ExitWhenDone {
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

// publish publishes msgs with confirms, in one producer span whose trace
// the consumer's spans continue (the traceparent header).
func publish(ctx context.Context, b Broker, tel *ops.Telemetry, msgs []*ackwise.Message) error {
	sink, err := adapters.OpenSink(ctx, b.SinkURL, adapters.WithLogger(tel.Logger), adapters.WithTracerProvider(tel.Tracer))
	if err != nil {
		return err
	}
	defer sink.Close()
	pub, err := producer.New(sink, producer.Config{})
	if err != nil {
		return err
	}
	ctx, span := tel.Tracer.Tracer(b.Service).Start(ctx, "publish demo orders", trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	return pub.Publish(ctx, msgs...)
}
