package consumer_test

// Review tests: each one demonstrates a suspected engine bug (it fails until
// the engine is fixed) unless its comment says it covers an untested path.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// waitStats polls c.Stats until ok or the timeout (no event exists for it).
func waitStats(c *consumer.Consumer, timeout time.Duration, ok func(consumer.Stats) bool) bool {
	deadline := time.Now().Add(timeout)
	for !ok(c.Stats()) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// tripBreaker builds a consumer on a fresh fake source with three messages
// of three keys and a threshold-2 breaker on a virtual clock. The first three
// handler calls fail transiently; then next decides. It returns once the
// breaker is open holding two messages (the first failure was nacked).
func tripBreaker(t *testing.T, next func(call int64) error) (*consumer.Consumer, *fakeSource, *memory.VirtualClock, func() error) {
	t.Helper()
	clock := memory.NewVirtualClock(time.Time{})
	src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(3, 3)...)
	var calls atomic.Int64
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		n := calls.Add(1)
		if n <= 3 {
			return errDown
		}
		return next(n)
	})
	c, err := consumer.New(src, h, consumer.Config{
		Concurrency: 2,
		Ordering:    consumer.OrderNone,
		Clock:       clock,
		Breaker:     &consumer.Breaker{Threshold: 2, ProbeInterval: time.Second, MaxProbeInterval: 4 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.Paused && s.Held == 2 }) {
		t.Fatalf("breaker did not open holding 2: %+v", c.Stats())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		t.Fatal("probe timer not armed")
	}
	return c, src, clock, stop
}

// Regression (fixed): a probe message that ends any way other than a transient failure or a
// success (permanent error, discard, panic, Valid()==false, settle failure)
// leaves breaker.probing set forever: no new probe is ever armed, the other
// held messages and their key lanes are stuck and receiving stays paused.
func TestRegressionProbeDeadLetteredStrandsHeldMessages(t *testing.T) {
	t.Parallel()
	c, src, clock, _ := tripBreaker(t, func(n int64) error {
		if n == 4 { // the first probe hits a poison message
			return ackwise.Permanent(errors.New("bad payload"))
		}
		return nil
	})
	clock.Advance(time.Second) // first probe
	if !src.waitSettled(2, 5*time.Second) {
		t.Fatalf("probe not dead-lettered: %+v", c.Stats())
	}
	for range 5 {
		clock.Advance(4 * time.Second) // any later probe interval
		if src.waitSettled(3, 200*time.Millisecond) {
			return
		}
	}
	t.Fatalf("the last held message was never probed again: %+v (pending timers %d)", c.Stats(), clock.Pending())
}

// Regression (fixed): stop() re-queues the held messages but leaves breaker.open (and
// probing) set; a second Run then waits in awaitSpace for a breaker that can
// never close (no probe timer, nothing held) and receives nothing.
func TestRegressionBreakerOpenAcrossRuns(t *testing.T) {
	t.Parallel()
	c, src, _, stop := tripBreaker(t, func(int64) error { return nil })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	released := len(src.released)
	src.mu.Unlock()
	if released != 2 {
		t.Fatalf("released %d held messages at stop, want 2", released)
	}
	more := msgs(1, 1)
	more[0].ID = "after-restart"
	src.push(more...)
	run(t, c)
	if !src.waitSettled(2, 2*time.Second) { // 1 nack from the first run + this ack
		t.Fatalf("second Run handles nothing: %+v", c.Stats())
	}
}

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

// failingNack is a source whose Nack fails, without settling the message
// and with its delivery still valid, its first fails calls.
type failingNack struct {
	*fakeSource
	fails *atomic.Int32
}

func (f failingNack) Nack(ctx context.Context, m *ackwise.Message, d time.Duration) error {
	if f.fails.Add(-1) >= 0 {
		return errors.New("wait queue publish: refused")
	}
	return f.fakeSource.Nack(ctx, m, d)
}

// A failed Nack does not abandon the delivery (before, the engine only
// counted SettleFailed: on AMQP the delivery stayed unacked on a live
// channel, never redelivered, holding a prefetch slot). It is tried again
// in place until it succeeds, without running the handler again; at stop,
// a message still waiting is handed back.
func TestFailedNackTriedAgain(t *testing.T) {
	t.Parallel()
	for _, fails := range []int32{2, 1 << 30} {
		t.Run(fmt.Sprint(fails), func(t *testing.T) {
			t.Parallel()
			src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(1, 1)...)
			n := new(atomic.Int32)
			n.Store(fails)
			var runs atomic.Int32
			h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { runs.Add(1); return errDown })
			c, err := consumer.New(failingNack{src, n}, h, consumer.Config{RetryMode: consumer.RetryBroker})
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, c)
			if fails == 2 {
				if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.SettleFailed == 2 && s.Retried == 1 && s.InFlight == 0 }) {
					t.Fatalf("stats %+v", c.Stats())
				}
			} else if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.SettleFailed >= 3 }) {
				t.Fatalf("stats %+v", c.Stats())
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			src.mu.Lock()
			defer src.mu.Unlock()
			released := 0
			if fails > 2 {
				released = 1 // still failing at stop: handed back
			}
			if len(src.released) != released || src.outstanding != 0 || runs.Load() != 1 {
				t.Fatalf("released %d (want %d), outstanding %d, handler runs %d (want 1)", len(src.released), released, src.outstanding, runs.Load())
			}
		})
	}
}

// RetryPanics makes a panic transient: retried, not dead-lettered.
func TestRegressionRetryPanicsHonoured(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(1, 1)...)
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { panic("flaky") })
	c, err := consumer.New(src, h, consumer.Config{RetryPanics: true})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	if !src.waitSettled(1, 5*time.Second) {
		t.Fatal("not settled")
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if len(src.nacked) != 1 {
		t.Fatalf("RetryPanics: nacked %d dead %d, want a retry", len(src.nacked), len(src.dead))
	}
}

// errAfterBatch returns its messages together with a receive error once.
type errAfterBatch struct {
	*fakeSource
	failed atomic.Bool
}

func (s *errAfterBatch) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	n, err := s.fakeSource.Receive(ctx, buf)
	if err == nil && n > 0 && s.failed.CompareAndSwap(false, true) {
		return n, errors.New("fetch: partial batch")
	}
	return n, err
}

// Coverage: a Receive returning n>0 with an error still hands the
// n messages to the handler, counts the error and keeps receiving.
func TestRegressionReceivePartialBatchWithError(t *testing.T) {
	t.Parallel()
	src := &errAfterBatch{fakeSource: newFakeSource(adapters.Capabilities{Delay: true}, msgs(3, 3)...)}
	c, err := consumer.New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil }), consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	if !src.waitSettled(3, 5*time.Second) {
		t.Fatal("batch returned with an error was not handled")
	}
	src.push(msgs(2, 2)...)
	if !src.waitSettled(5, 5*time.Second) {
		t.Fatal("receiving did not go on after the error")
	}
	// The engine counts an ack once the source took it: wait for the count.
	if !waitStats(c, 5*time.Second, func(st consumer.Stats) bool { return st.Acked == 5 }) || c.Stats().ReceiveErrors != 1 {
		t.Fatalf("stats %+v", c.Stats())
	}
}

// Coverage: a probe that fails transiently doubles the interval and
// probes again; the probe's success closes the breaker and re-runs every held
// message, and no attempt was spent while held.
func TestRegressionProbeFailsThenSucceeds(t *testing.T) {
	t.Parallel()
	c, src, clock, _ := tripBreaker(t, func(n int64) error {
		if n == 4 {
			return errDown
		}
		return nil
	})
	clock.Advance(time.Second) // probe 1 fails: next in 2s
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.Held == 2 }) {
		t.Fatalf("failed probe not held again: %+v", c.Stats())
	}
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		t.Fatal("second probe not armed")
	}
	clock.Advance(time.Second)
	if src.waitSettled(2, 100*time.Millisecond) {
		t.Fatal("probe interval did not double")
	}
	clock.Advance(time.Second)
	if !src.waitSettled(3, 5*time.Second) {
		t.Fatalf("held messages not settled after probe success: %+v", c.Stats())
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	for _, m := range src.acked {
		if m.Attempt != 1 {
			t.Fatalf("held message %s spent attempts: %d", m.ID, m.Attempt)
		}
	}
	if st := c.Stats(); st.Paused || st.Held != 0 || st.BreakerTrips != 1 {
		t.Fatalf("stats %+v", st)
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

// Regression (fixed): validate checks MaxInFlight against the raw Concurrency, before
// defaults (config.go:179); MaxInFlight 2 with the default Concurrency 4 is
// accepted although the doc says MaxInFlight must be at least Concurrency.
func TestRegressionMaxInFlightBelowDefaultConcurrency(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{})
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })
	if _, err := consumer.New(src, h, consumer.Config{MaxInFlight: 2}); err == nil {
		t.Fatal("MaxInFlight 2 below the default Concurrency 4 accepted")
	}
}

// outcomeLog records every outcome observed, and runs on, if set, on each.
type outcomeLog struct {
	mu  sync.Mutex
	all []consumer.Outcome
	on  func(consumer.Outcome)
}

func (o *outcomeLog) Observe(_ *ackwise.Message, out consumer.Outcome, _ time.Duration) {
	o.mu.Lock()
	o.all = append(o.all, out)
	o.mu.Unlock()
	if o.on != nil {
		o.on(out)
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

// typedNilError's Error dereferences its receiver.
type typedNilError struct{ text string }

func (e *typedNilError) Error() string { return e.text }

// memoryQueue is a memory broker on a virtual clock with a fresh queue q
// and a source on it.
func memoryQueue(t *testing.T) (*memory.Broker, *memory.VirtualClock, string, *memory.QueueSource) {
	t.Helper()
	br, clk := memorytest.NewBroker(t)
	q := memorytest.UniqueName(t)
	if err := br.CreateQueue(q, memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	src, err := br.QueueSource(q)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return br, clk, q, src
}

// TestPermanentTypedNilIsDeadLettered: a handler returns
// ackwise.Permanent of a typed nil *typedNilError (the classic Go slip).
// The error is not nil and its text panics; the engine, building the dead
// letter's error header, must not crash the process (and every consumer the
// message is redelivered to) but dead-letter the message.
func TestPermanentTypedNilIsDeadLettered(t *testing.T) {
	t.Parallel()
	br, _, q, src := memoryQueue(t)
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		var e *typedNilError
		return ackwise.Permanent(e)
	})
	c, err := consumer.New(src, h, consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	memorytest.Publish(t, br, q, memorytest.Msg("m", "k", "x"))
	memorytest.WaitFor(t, br, q, "m dead-lettered", func(evs []memory.Event) bool {
		for _, e := range evs {
			if e.Kind == memory.EventDeadLettered && e.ID == "m" {
				return true
			}
		}
		return false
	})
	memorytest.RequireDeadLettered(t, br, q, "m", dlq.ReasonPermanent)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestJoinedDiscardBesideFailureIsRetried: a handler joins a Discard with
// an unmarked failure (one part of its work found the message obsolete,
// another could not reach its database). The message is not dropped: it
// is retried, as the failure alone would be, and handled on its second
// attempt.
func TestJoinedDiscardBesideFailureIsRetried(t *testing.T) {
	t.Parallel()
	br, clk, q, src := memoryQueue(t)
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.Attempt == 1 {
			return errors.Join(ackwise.Discard(errors.New("obsolete")), errors.New("db down"))
		}
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{Retry: retry.Policy{InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	memorytest.Publish(t, br, q, memorytest.Msg("m", "k", "x"))
	memorytest.WaitFor(t, br, q, "m nacked", func(evs []memory.Event) bool {
		return slices.ContainsFunc(evs, func(e memory.Event) bool { return e.Kind == memory.EventNacked && e.ID == "m" })
	})
	clk.Advance(time.Second)
	acked := memorytest.WaitForAcked(t, br, q, "m")
	if acked.Attempt != 2 {
		t.Fatalf("m acked on attempt %d: want 2 (the joined failure retried, not discarded)", acked.Attempt)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// refusingMoves refuses every dead letter, its deliveries staying valid (a
// dead-letter queue that does not exist, say).
type refusingMoves struct{ *fakeSource }

func (refusingMoves) DeadLetter(context.Context, *ackwise.Message, dlq.Envelope) error {
	return errors.New("dead-letter queue: NOT_FOUND")
}

// unsupportedMoves cannot dead-letter at all (a plain RabbitMQ queue: its
// DeadLetter returns an error wrapping errors.ErrUnsupported).
type unsupportedMoves struct{ *fakeSource }

func (unsupportedMoves) DeadLetter(context.Context, *ackwise.Message, dlq.Envelope) error {
	return fmt.Errorf("plain source: %w", errors.ErrUnsupported)
}

// A move the source can never make is not tried again in place: the
// message is handed back at once, as a failed settle.
func TestUnsupportedMoveNotTriedAgain(t *testing.T) {
	t.Parallel()
	src := unsupportedMoves{newFakeSource(adapters.Capabilities{}, msgs(1, 1)...)}
	c, err := consumer.New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		return ackwise.Permanent(errors.New("invalid order"))
	}), consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.SettleFailed == 1 && s.InFlight == 0 }) {
		t.Fatalf("stats %+v: want one failed settle, handed back", c.Stats())
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if len(src.released) != 1 {
		t.Fatalf("released %d, want 1", len(src.released))
	}
}
