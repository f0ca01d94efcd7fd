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

// TestStuckHandlerKeepsLeaseAfterDrainTimeout: a handler that ignores its
// cancelled context outlives Run, which returns ErrDrainTimeout. Its message
// keeps its lease until the handler returns: another consumer of the queue
// does not get it meanwhile, and the late success is acknowledged. Before,
// the heartbeat stopped with Run; the lease ran out and the broker handed
// the message to another consumer while the first still worked on it.
func TestStuckHandlerKeepsLeaseAfterDrainTimeout(t *testing.T) {
	t.Parallel()
	clock, br, src := leasedQueue(t) // a 30s lease
	started, finish := make(chan struct{}), make(chan struct{})
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		close(started)
		<-finish // ignores its context
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{Clock: clock, DrainTimeout: 20 * time.Millisecond})
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
		t.Fatalf("Run = %v, want ErrDrainTimeout", err)
	}
	// Five lease lengths of virtual time, in the heartbeat's steps (its
	// timer armed before each, so time never outruns it). Without a
	// heartbeat, the rest at once.
	for i := range 30 {
		wait, cancelWait := context.WithTimeout(context.Background(), 2*time.Second)
		err := clock.WaitForTimers(wait, 1)
		cancelWait()
		if err != nil {
			t.Logf("no heartbeat after Run returned (step %d): %v", i, err)
			clock.Advance(time.Duration(30-i) * 5 * time.Second)
			break
		}
		clock.Advance(5 * time.Second)
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
