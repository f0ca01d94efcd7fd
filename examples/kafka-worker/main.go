// Command kafka-worker is a production-shaped ackwise worker on Kafka: a
// team can copy it and replace the order handling with its own.
//
//   - Topics: the topic, one retry topic per tier (TOPIC.retry.TIER) and
//     the dead-letter topic (TOPIC.dlq), created at start with the same
//     partition count (kafka.CreateTopics; topics that exist are left
//     alone). Offsets are committed only for settled records.
//   - Exactly-once effects: the idempotency inbox on PostgreSQL (pginbox),
//     committed with the shipment; -sqlite uses a SQLite file instead.
//   - Retries through the retry topics (-tiers), then the dead-letter
//     topic with the full context in headers.
//   - Metrics (OpenTelemetry, exported to Prometheus; the franz-go
//     client's too) at /metrics, the probes /healthz and /readyz, on
//     -addr; traces to stdout with -traces=stdout; JSON logs on stderr.
//   - consumer.Runner: SIGINT or SIGTERM drains (running handlers finish,
//     their offsets are committed; the rest is fetched again by the next
//     member of the group).
//
// Without -brokers it starts kfake, franz-go's Kafka-protocol broker, in
// the process, on -kfake-port: no Kafka needed to try it, and the ackwise
// CLI reaches it while the worker runs. With -demo N it first publishes N
// demo orders: every fourth fails twice (the warehouse is down) and is
// retried through the retry topics, and the last is poison and is
// dead-lettered. With -exit-when-done it drains and exits once they are
// all settled, and prints what became of them:
//
//	go run ./examples/kafka-worker -demo 20 -exit-when-done -sqlite /tmp/orders.db
//	orders=20 acked=19 dead_lettered=1 retried=8 shipped=19 double_shipped=0 duplicates_absorbed=0
//
// This file holds what is particular to Kafka (flags, URLs, topics, kfake);
// the service around the consumer is examples/internal/worker, the order
// handling examples/internal/orders. README.md beside this file shows how
// to watch the worker and redrive its dead letters.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ackwise/ackwise/adapters/kafka" // registers kafka://
	"github.com/ackwise/ackwise/examples/internal/orders"
	"github.com/ackwise/ackwise/examples/internal/worker"
)

type options struct {
	worker.Options
	brokers    string // host:port,host:port; empty: kfake in the process
	kfakePort  int
	topic      string
	group      string
	partitions int
	tiers      string
}

func main() {
	var o options
	o.Flags(flag.CommandLine)
	flag.StringVar(&o.brokers, "brokers", os.Getenv("KAFKA_BROKERS"), "Kafka `brokers`, host:port,… (env KAFKA_BROKERS); empty: start kfake in the process")
	flag.IntVar(&o.kfakePort, "kfake-port", 9092, "`port` of the in-process kfake, without -brokers (0: any free port)")
	flag.StringVar(&o.topic, "topic", "orders", "`topic` to consume; its retry topics are TOPIC.retry.TIER, its dead-letter topic TOPIC.dlq")
	flag.StringVar(&o.group, "group", worker.Name, "consumer `group`")
	flag.IntVar(&o.partitions, "partitions", 6, "partitions of the topics it creates")
	flag.StringVar(&o.tiers, "tiers", "1s,5s,30s", "retry delays, one retry topic `each`")
	flag.Parse()

	sum, err := run(context.Background(), o, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kafka-worker:", err)
		os.Exit(1)
	}
	if o.Demo > 0 {
		fmt.Println(sum)
	}
}

// run creates the topics (after starting kfake, without brokers) and runs
// the worker (worker.Run) on o's topic.
func run(ctx context.Context, o options, stdout, stderr io.Writer) (orders.Summary, error) {
	if err := o.Check(); err != nil {
		return orders.Summary{}, err
	}
	if o.brokers == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(o.kfakePort))
		if err != nil {
			return orders.Summary{}, fmt.Errorf("start kfake on port %d (another one running? -kfake-port 0 picks a free port): %w", o.kfakePort, err)
		}
		defer c.Close()
		o.brokers = strings.Join(c.ListenAddrs(), ",")
		if stderr != nil {
			slog.New(slog.NewJSONHandler(stderr, nil)).Info("started kfake, an in-process Kafka; it ends with the worker", slog.String("brokers", o.brokers))
		}
	}
	u := url.URL{Scheme: "kafka", Host: o.brokers, Path: "/" + o.topic}
	sink := u.String()
	u.RawQuery = url.Values{"group": {o.group}, "tiers": {o.tiers}}.Encode()
	source := u.String()

	// The source refuses to open without its retry topics: create the
	// whole chain first, from the same URL.
	cfg, err := kafka.ParseURL(&u)
	if err != nil {
		return orders.Summary{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := kafka.CreateTopics(cctx, cfg, int32(o.partitions), -1); err != nil {
		return orders.Summary{}, fmt.Errorf("create topics: %w", err)
	}
	return worker.Run(ctx, o.Options, worker.Broker{
		Service:     "kafka-worker",
		System:      "kafka",
		SourceURL:   source,
		SinkURL:     sink,
		SourceMeter: true, // franz-go's client metrics
	}, stdout, stderr)
}
