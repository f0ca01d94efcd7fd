package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/adaptertest"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// failingConsumer runs the consumer engine on cfg's work queue with a
// handler that fails every message as permanent: it dead-letters each one
// into cfg's dead-letter queue, also the copies a redrive moves back. It
// stops when the test ends.
func failingConsumer(t *testing.T, cfg Config) {
	t.Helper()
	src := newSource(t, cfg)
	c, err := consumer.New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		return ackwise.Permanent(errors.New("still broken"))
	}), consumer.Config{Name: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("consumer: %v", err)
		}
	})
}

// waitReady waits until queue holds n ready messages.
func waitReady(ctx context.Context, t *testing.T, c *amqp.Connection, queue string, n int) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		got := queueDepth(t, c, queue)
		if got == n {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("%s holds %d ready messages, want %d: %v", queue, got, n, ctx.Err())
		}
	}
}

// redriveRun redrives cfg's dead-letter queue into its work queue with
// dlq.Redrive, through a plain source and a sink opened for this run and
// closed after it, as the CLI does. It returns the result and the event
// IDs moved, failing the test if one was moved twice.
func redriveRun(ctx context.Context, t *testing.T, cfg Config, prefetch int, opts dlq.RedriveOptions) (dlq.RedriveResult, map[string]bool, int) {
	t.Helper()
	from := newSource(t, Config{URL: cfg.URL, Queue: cfg.Queue + ".dlq", Plain: true, Prefetch: prefetch})
	to := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue})
	res, moved, limited := adaptertest.RedriveRun(ctx, t, from, to, opts)
	if err := from.Close(); err != nil {
		t.Fatal(err)
	}
	if err := to.Close(); err != nil {
		t.Fatal(err)
	}
	return res, moved, limited
}

// requireRedriveCounts fails unless cfg's dead-letter queue holds n dead
// letters, each with redrive count want (read with dlq.Inspect, which
// releases them all).
func requireRedriveCounts(ctx context.Context, t *testing.T, cfg Config, n int, want string) {
	t.Helper()
	from := newSource(t, Config{URL: cfg.URL, Queue: cfg.Queue + ".dlq", Plain: true, Prefetch: 2 * n})
	defer from.Close()
	res, err := dlq.Inspect(ctx, from, dlq.InspectOptions{Max: n + 1, IdleTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Letters) != n {
		t.Fatalf("dead-letter queue holds %d letters, want %d", len(res.Letters), n)
	}
	for _, l := range res.Letters {
		if got := l.Message.Headers.Get(dlq.HeaderRedriveCount); got != want {
			t.Fatalf("%s: %s = %q, want %q", l.Message.ID, dlq.HeaderRedriveCount, got, want)
		}
	}
}

// TestRedriveIntoAFailingConsumerEnds: a redrive from a RabbitMQ
// dead-letter queue into a work queue whose consumer (the engine) still
// fails every message and dead-letters it back into the queue the run
// reads. Before, such a run moved the same dead letters round and round
// and never ended (2,130 moves from a 2,000-message DLQ in 30s). Now the
// source tells the run what the queue held as it began to consume
// (Backlog: all n, the deliveries the broker pushed ahead of Receive
// included; its prefetch is below n), the run moves each dead letter once
// and ends there (StopBacklog); the second and third runs do the same;
// the fourth leaves them all (redrive count 3, RedriveLimited), and a
// forced fifth moves them again.
func TestRedriveIntoAFailingConsumerEnds(t *testing.T) {
	t.Parallel()
	const n = 200 // above DefaultPrefetch: the source has taken part of the queue before the run asks
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	dead := cfg.Queue + ".dlq"
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute) // generous: a busy machine
	defer cancel()

	failingConsumer(t, cfg)
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue})
	msgs := make([]*ackwise.Message, n)
	for i := range msgs {
		msgs[i] = &ackwise.Message{ID: fmt.Sprint("e", i), Payload: []byte("p")}
	}
	if err := sink.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	waitReady(ctx, t, c, dead, n)

	// Each run must end by itself: within two minutes, not at the Max
	// safety net (which a run without the fix reaches).
	opts := dlq.RedriveOptions{Rate: dlq.RateUnlimited, IdleTimeout: 10 * time.Second, Max: 5 * n}
	run := func(prefetch int, opts dlq.RedriveOptions) (dlq.RedriveResult, map[string]bool, int) {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		return redriveRun(rctx, t, cfg, prefetch, opts)
	}
	for k := 1; k <= dlq.DefaultMaxRedrives; k++ {
		res, moved, _ := run(0, opts)
		if res.Moved != n || len(moved) != n || res.Stop != dlq.StopBacklog || res.Backlog != n || res.RedriveLimited != 0 || res.AlreadyMoved != 0 {
			t.Fatalf("run %d: %+v, %d events moved; want %d moved once each, stopped at a backlog of %d", k, res, len(moved), n, n)
		}
		waitReady(ctx, t, c, dead, n) // every one failed again
		requireRedriveCounts(ctx, t, cfg, n, strconv.Itoa(k))
		// The inspection's releases are back in the queue before the next
		// run counts it: a channel's close returns to the client before
		// the queue has taken back what it held (a run starting then
		// counts 0 and ends at once, at that backlog).
		waitReady(ctx, t, c, dead, n)
	}

	// Past the limit: nothing moves. The source's prefetch lets the run
	// hold every dead letter it leaves (else the run ends idle at the
	// prefetch, as documented).
	res, moved, limited := run(2*n, opts)
	if res.Moved != 0 || len(moved) != 0 || res.RedriveLimited != n || limited != n || res.Stop != dlq.StopBacklog || res.Backlog != n {
		t.Fatalf("run past the limit: %+v (%d reported); want nothing moved, %d left", res, limited, n)
	}
	waitReady(ctx, t, c, dead, n) // released, all of them
	requireRedriveCounts(ctx, t, cfg, n, strconv.Itoa(dlq.DefaultMaxRedrives))
	waitReady(ctx, t, c, dead, n) // as in the loop above

	opts.Force = true
	res, moved, _ = run(0, opts)
	if res.Moved != n || len(moved) != n || res.Stop != dlq.StopBacklog || res.Backlog != n {
		t.Fatalf("forced run: %+v; want %d moved", res, n)
	}
	waitReady(ctx, t, c, dead, n)
	requireRedriveCounts(ctx, t, cfg, n, strconv.Itoa(dlq.DefaultMaxRedrives+1))
}

// TestBacklog: Backlog counts what the queue held when the source began to
// consume, the deliveries the broker pushed ahead of Receive included
// (queue.declare-ok counts ready messages only: a count taken now would
// miss them); it is an error once the source has received, and for a
// queue that no longer exists.
func TestBacklog(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	name := "ackwise-test-backlog-" + randSuffix()
	plainQueue(t, c, name)
	for i := range 5 {
		rawPublish(t, c, name, amqp.Publishing{MessageId: fmt.Sprint("m", i), Body: []byte("p")})
	}
	src := newSource(t, Config{URL: testURL(), Queue: name, Plain: true, Prefetch: 3})
	// The broker pushes 3 deliveries to the source, which leaves 2 ready.
	waitReady(ctxT(t), t, c, name, 2)
	if n, err := src.Backlog(ctxT(t)); err != nil || n != 5 {
		t.Fatalf("Backlog = %d, %v; want 5", n, err)
	}
	// QueueDepth counts the ready messages now, consuming nothing.
	if n, err := QueueDepth(ctxT(t), Config{URL: testURL(), Queue: name}); err != nil || n != 2 {
		t.Fatalf("QueueDepth = %d, %v; want 2", n, err)
	}
	m := receive(t, src)
	if _, err := src.Backlog(ctxT(t)); err == nil {
		t.Error("Backlog after a Receive: no error")
	}
	if err := src.Release(ctxT(t), m); err != nil {
		t.Fatal(err)
	}

	gone := newSource(t, Config{URL: testURL(), Queue: name, Plain: true})
	if err := withChannel(c, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(name, false, false, false)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := gone.Backlog(ctxT(t)); err == nil {
		t.Error("Backlog of a deleted queue: no error")
	}
	if _, err := QueueDepth(ctxT(t), Config{URL: testURL(), Queue: name}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("QueueDepth of a deleted queue = %v", err)
	}
}
