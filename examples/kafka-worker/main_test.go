package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/examples/internal/ops"
	"github.com/ackwise/ackwise/examples/internal/orders"
	"github.com/ackwise/ackwise/examples/internal/worker"
	"github.com/ackwise/ackwise/examples/internal/workertest"
)

// setup returns options for a worker on a kfake broker of the test's own
// (closed when the test ends), with a PostgreSQL schema of its own.
func setup(t *testing.T, demo int) options {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL; -short runs offline tests only")
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return options{
		Options:    workertest.Options(t, demo),
		brokers:    strings.Join(c.ListenAddrs(), ","),
		topic:      "orders-" + workertest.Suffix(),
		group:      worker.Name,
		partitions: 3,
		tiers:      "100ms,200ms",
	}
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

// deadLetters reads every record of o's dead-letter topic.
func deadLetters(t *testing.T, o options) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(o.brokers, ",")...), kgo.ConsumeTopics(o.topic+".dlq"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), workertest.Wait)
	defer cancel()
	// Wait for the first; then one short poll takes any other already there.
	var recs []*kgo.Record
	for len(recs) == 0 {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("read %s.dlq: %v", o.topic, err)
		}
		recs = append(recs, fs.Records()...)
	}
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelShort()
	recs = append(recs, cl.PollFetches(short).Records()...)
	return recs
}

// TestWorkerEndToEnd runs the worker with 12 demo orders on kfake and the
// real PostgreSQL: while it runs /readyz is 200 and /metrics serves
// ackwise's instruments; the flaky orders are retried through the retry
// topics, the poison order lands in the dead-letter topic byte for byte
// with its envelope, every other order ships once; logs are JSON and the
// consumer's spans continue the producer's trace.
func TestWorkerEndToEnd(t *testing.T) {
	t.Parallel()
	o := setup(t, 12)
	o.Traces = ops.TracesStdout
	var traces, logs workertest.Buffer
	sum, scrape := workertest.RunDemo(t, start(t, o, &traces, &logs), 12)
	if !strings.Contains(scrape, "messaging_kafka_") {
		t.Error("/metrics lacks the franz-go client's messaging_kafka_* metrics")
	}
	poison := sum.IDPrefix + "0011"
	recs := deadLetters(t, o)
	if len(recs) != 1 {
		t.Fatalf("%d dead letters, want 1", len(recs))
	}
	h := ackwise.Headers{}
	for _, kv := range recs[0].Headers {
		h.Add(kv.Key, string(kv.Value))
	}
	env, err := dlq.Decode(h)
	if err != nil || string(recs[0].Value) != `{"id": "`+poison+`", "cents": "lots"` || h.Get(ackwise.HeaderEventID) != poison ||
		env.Reason != dlq.ReasonPermanent || env.Consumer != worker.Name || env.Source != o.topic {
		t.Fatalf("dead letter: %q, envelope %+v (%v), headers %v", recs[0].Value, env, err, h)
	}
	workertest.CheckLogs(t, &logs, poison)
	// 12 orders, 4 retries: 16 handler runs, each in the producer's trace.
	workertest.CheckTraces(t, &traces, "process "+o.topic, 16)
}

// TestWorkerDrainsOnSIGTERM: SIGTERM while orders are being handled drains
// the worker: handlers running finish and their offsets are committed, run
// returns nil, and the rest is left to the group. A restarted worker
// handles it: every order ships exactly once, the poison one is
// dead-lettered. (Not parallel: SIGTERM goes to the whole test process.)
func TestWorkerDrainsOnSIGTERM(t *testing.T) {
	o := setup(t, 30)
	workertest.CheckDrainAndRestart(t, o.Schema, func(demo int, work time.Duration, concurrency int) *workertest.Worker {
		o := o
		o.Demo, o.Work, o.Concurrency = demo, work, concurrency
		return start(t, o, nil, nil)
	})
	if recs := deadLetters(t, o); len(recs) != 1 {
		t.Fatalf("%d dead letters, want 1", len(recs))
	}
}

// TestWorkerStartsKfake: without brokers the worker starts kfake itself
// and creates its topics; with -sqlite it needs no PostgreSQL, and with
// -exit-when-done it returns by itself once the demo orders are settled.
func TestWorkerStartsKfake(t *testing.T) {
	t.Parallel()
	o := options{
		Options: worker.Options{
			Attempts: 4, Concurrency: 4, Addr: "127.0.0.1:0", Drain: 10 * time.Second,
			SQLite: filepath.Join(t.TempDir(), "worker.db"), Demo: 5, ExitWhenDone: true,
		},
		kfakePort: 0, topic: "orders", group: worker.Name, partitions: 2, tiers: "100ms",
	}
	workertest.CheckExitsWhenDone(t, o.Demo, func(ctx context.Context) (orders.Summary, error) { return run(ctx, o, nil, nil) })
}
