package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/internal/logbuf"
)

// TestRetryAfterLongerThanLeaseInPlace: an in-place wait for a
// RetryAfter ten times the lease keeps the delivery (the heartbeat extends
// it): it is delivered once, run twice and acked once.
func TestRetryAfterLongerThanLeaseInPlace(t *testing.T) {
	t.Parallel()
	failOnceKeepsDelivery(t, ackwise.RetryAfter(errors.New("429"), 5*time.Minute),
		func(clock ackwise.Clock) consumer.Config {
			return consumer.Config{Clock: clock, RetryMode: consumer.RetryInPlace}
		},
		"retried", func(s consumer.Stats) bool { return s.Retried == 1 }, 350*time.Second)
}

// TestBreakerHeldBeyondLease: a message the open breaker holds for
// longer than the lease keeps its delivery until the probe succeeds.
func TestBreakerHeldBeyondLease(t *testing.T) {
	t.Parallel()
	failOnceKeepsDelivery(t, errors.New("down"),
		func(clock ackwise.Clock) consumer.Config {
			return consumer.Config{Clock: clock, Breaker: &consumer.Breaker{Threshold: 1, ProbeInterval: 2 * time.Minute}}
		},
		"held", func(s consumer.Stats) bool { return s.Held == 1 }, 200*time.Second)
}

// failOnceKeepsDelivery runs a consumer (configured by cfg) on a leased
// queue with a handler that fails once with first, then succeeds. Once the
// consumer reports the failure (waiting), virtual time moves on, up to
// limit, until the second run: the message must have been received once,
// run twice and acked once, its lease kept by the heartbeat meanwhile.
func failOnceKeepsDelivery(t *testing.T, first error, cfg func(ackwise.Clock) consumer.Config, what string, waiting func(consumer.Stats) bool, limit time.Duration) {
	t.Helper()
	clock, br, src := leasedQueue(t)
	var runs atomic.Int64
	again := make(chan struct{})
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		if runs.Add(1) == 1 {
			return first
		}
		close(again)
		return nil
	})
	c, err := consumer.New(src, h, cfg(clock))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := br.Publish(ctx, "q", &ackwise.Message{ID: "m"}); err != nil {
		t.Fatal(err)
	}
	if !waitStats(c, 5*time.Second, waiting) {
		t.Fatalf("not %s: %+v", what, c.Stats())
	}
	advanceUntil(ctx, t, clock, limit, again)
	waitIdleQueue(t, c, br, "q")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Acked != 1 || st.SettleFailed != 0 || st.Received != 1 || runs.Load() != 2 || st.Paused {
		t.Fatalf("stats %+v, runs %d: want received once, run twice, acked once", st, runs.Load())
	}
}

// leasedQueue returns a memory broker on a virtual clock with a queue "q"
// whose deliveries have a 30s lease, and a source on it closed with t.
func leasedQueue(t *testing.T) (*memory.VirtualClock, *memory.Broker, *memory.QueueSource) {
	t.Helper()
	clock := memory.NewVirtualClock(time.Time{})
	br, err := memory.New(memory.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := br.CreateQueue("q", memory.QueueConfig{Lease: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	src, err := br.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return clock, br, src
}

// advanceUntil moves clock on in 5s steps, at most limit in all, until done
// is closed.
func advanceUntil(ctx context.Context, t *testing.T, clock *memory.VirtualClock, limit time.Duration, done <-chan struct{}) {
	t.Helper()
	for moved := time.Duration(0); moved < limit; moved += 5 * time.Second {
		if err := clock.WaitForTimers(ctx, 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(5 * time.Second)
		select {
		case <-done:
			return
		case <-time.After(time.Millisecond): // lets what the step woke run before more time passes
		}
	}
	t.Fatalf("not done after %v of virtual time", limit)
}

// stuckAfterDrain runs a consumer of a leased memory queue (30s lease) on a
// virtual clock whose handler ignores its cancelled context until finish is
// closed, publishes one message, stops Run once the handler started and
// waits for ErrDrainTimeout. The test closes finish.
func stuckAfterDrain(t *testing.T) (clock *memory.VirtualClock, br *memory.Broker, src *memory.QueueSource, c *consumer.Consumer, finish chan struct{}, log *logbuf.Buffer) {
	t.Helper()
	clock, br, src = leasedQueue(t)
	started := make(chan struct{})
	finish = make(chan struct{})
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		close(started)
		<-finish // ignores its context
		return nil
	})
	log = &logbuf.Buffer{}
	c, err := consumer.New(src, h, consumer.Config{Clock: clock, DrainTimeout: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	if err := br.Publish(context.Background(), "q", &ackwise.Message{ID: "stuck"}); err != nil {
		t.Fatal(err)
	}
	<-started
	cancel()
	if err := <-done; !errors.Is(err, consumer.ErrDrainTimeout) {
		close(finish)
		t.Fatalf("Run = %v, want ErrDrainTimeout", err)
	}
	return clock, br, src, c, finish, log
}

// advanceHeartbeats moves clock on in steps of 5s (the heartbeat runs every
// 10s, a third of the 30s lease), waiting before each for the heartbeat's
// timer so that time never outruns it. Without a heartbeat (none armed
// within 2s) it moves the rest at once, and reports false.
func advanceHeartbeats(t *testing.T, clock *memory.VirtualClock, steps int) bool {
	t.Helper()
	for i := range steps {
		wait, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := clock.WaitForTimers(wait, 1)
		cancel()
		if err != nil {
			clock.Advance(time.Duration(steps-i) * 5 * time.Second)
			return false
		}
		clock.Advance(5 * time.Second)
	}
	return true
}

// TestStuckHandlerKeepsLeaseAfterDrainTimeout: a handler that ignores its
// cancelled context outlives Run, which returns ErrDrainTimeout. Its message
// keeps its lease until the handler returns: another consumer of the queue
// does not get it meanwhile, and the late success is acknowledged. Before,
// the heartbeat stopped with Run; the lease ran out and the broker handed
// the message to another consumer while the first still worked on it.
func TestStuckHandlerKeepsLeaseAfterDrainTimeout(t *testing.T) {
	t.Parallel()
	clock, br, _, c, finish, _ := stuckAfterDrain(t)
	if !advanceHeartbeats(t, clock, 30) { // five lease lengths
		t.Log("no heartbeat after Run returned")
	}
	other, err := br.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	// No event says a message will not come: a short bounded receive.
	rctx, rcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer rcancel()
	if n, _ := other.Receive(rctx, make([]*ackwise.Message, 1)); n != 0 {
		close(finish)
		t.Fatal("another consumer got the message while its handler still ran")
	}
	close(finish)
	waitIdleQueue(t, c, br, "q")
	if st := c.Stats(); st.Acked != 1 {
		t.Fatalf("stats %+v: want the late success acked", st)
	}
}

// TestNoLeaseWarningsAfterSourceClosed: once the application closed the
// source after ErrDrainTimeout, the heartbeat that still runs for the stuck
// handler's message logs nothing about failing to extend its lease: the
// source is closed, the broker redelivers the message, and a warning every
// heartbeat for as long as the handler is stuck says nothing more.
func TestNoLeaseWarningsAfterSourceClosed(t *testing.T) {
	t.Parallel()
	clock, _, src, _, finish, log := stuckAfterDrain(t)
	defer close(finish)
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if !advanceHeartbeats(t, clock, 6) {
		t.Fatal("no heartbeat after Run returned")
	}
	if strings.Contains(log.String(), "lease extension failed") {
		t.Fatalf("warnings after the source was closed:\n%s", log.String())
	}
}
