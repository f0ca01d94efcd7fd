package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
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
