package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// Regression (fixed): Run never returns ErrDrainTimeout for a handler that ignores ctx:
// after the grace period it closes quit and then blocks in workers.Wait()
// until the handler returns (consumer.go:199-200).
func TestRegressionDrainTimeoutReturnsWithStuckHandler(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(1, 1)...)
	started := make(chan struct{})
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		close(started)
		<-block // ignores ctx
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{DrainTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-started
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, consumer.ErrDrainTimeout) {
			t.Fatalf("Run = %v, want ErrDrainTimeout", err)
		}
	case <-time.After(30 * time.Second): // deadline 20ms + grace 100ms; a Run waiting for the handler never returns
		t.Fatal("Run did not return ErrDrainTimeout: it waits for the stuck handler")
	}
}

// Regression (fixed): a handler cancelled at the drain deadline that returns an error not
// wrapping context.Canceled (a driver's "connection closed") is classified
// and, on its last attempt, dead-lettered: invariant 7 says a cancelled
// shutdown never dead-letters unfinished work (consumer.go:413).
func TestRegressionDrainCancelDoesNotDeadLetter(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(1, 1)...)
	started := make(chan struct{})
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
		close(started)
		<-ctx.Done()
		return errors.New("db: connection closed")
	})
	c, err := consumer.New(src, h, consumer.Config{DrainTimeout: 20 * time.Millisecond, Retry: retry.Policy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	<-started
	_ = stop()
	src.mu.Lock()
	defer src.mu.Unlock()
	if len(src.dead)+len(src.nacked)+len(src.acked) != 0 || len(src.released) != 1 {
		t.Fatalf("unfinished work settled at shutdown: dead %d nacked %d acked %d released %d", len(src.dead), len(src.nacked), len(src.acked), len(src.released))
	}
}

// After the drain deadline, messages still queued behind a stuck handler are
// released at once; the stuck handler's own message is released when it
// finally returns, and only then may the consumer run again.
func TestRegressionDrainTimeoutReleasesQueuedMessages(t *testing.T) {
	t.Parallel()
	const n = 12
	src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(n, n)...) // n keys
	started := make(chan struct{})
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
		if m.ID == "e0" {
			close(started)
			<-ctx.Done()
			time.Sleep(300 * time.Millisecond) // a slow cleanup, past the grace period
		}
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{Concurrency: 1, MaxInFlight: n, DrainTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-started
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.InFlight == n }) {
		t.Fatalf("not all dispatched: %+v", c.Stats())
	}
	cancel()
	if err := <-done; !errors.Is(err, consumer.ErrDrainTimeout) {
		t.Fatalf("Run = %v, want ErrDrainTimeout", err)
	}
	src.mu.Lock()
	outstanding := src.outstanding
	src.mu.Unlock()
	if st := c.Stats(); st.InFlight != 1 || outstanding != 1 {
		t.Fatalf("after Run returned: engine in flight %d, deliveries neither settled nor released %d; want only the stuck one", st.InFlight, outstanding)
	}
	if err := c.Run(context.Background()); !errors.Is(err, consumer.ErrRunning) {
		t.Fatalf("Run while a stuck handler is out = %v, want ErrRunning", err)
	}
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.InFlight == 0 }) {
		t.Fatalf("stuck handler's message never released: %+v", c.Stats())
	}
	src.mu.Lock()
	outstanding = src.outstanding
	src.mu.Unlock()
	if outstanding != 0 {
		t.Fatalf("%d deliveries neither settled nor released", outstanding)
	}
}

// A retry in place whose wait is refused because Run began stopping between
// the retry's decision and its wait: the message goes back to the broker,
// observed once, as Retried. Before, it was observed as Retried and then as
// Released, and counted in both.
func TestRetryRefusedAtStopObservedOnce(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{})
	var c *consumer.Consumer
	var stop func() error
	stopped := make(chan error, 1)
	obs := &outcomeLog{on: func(out consumer.Outcome) {
		if out != consumer.Retried {
			return
		}
		// Stop Run while the retry is between its decision and its wait,
		// and let the wait begin only once the drain has.
		go func() { stopped <- stop() }()
		deadline := time.Now().Add(5 * time.Second)
		for !consumer.Stopping(c) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond) // no event marks the drain's start
		}
	}}
	c, err := consumer.New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		return errors.New("transient")
	}), consumer.Config{Observer: obs, RetryMode: consumer.RetryInPlace})
	if err != nil {
		t.Fatal(err)
	}
	stop = run(t, c)
	src.push(&ackwise.Message{ID: "m", Source: "q", Partition: -1, Offset: -1}) // after stop is set
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
	requireRetriedOnce(t, c, obs, src)
}
