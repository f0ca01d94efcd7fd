package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

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

func (refusingMoves) DeadLetter(context.Context, *ackwise.Message, dlq.Envelope) error {
	return errors.New("dead-letter queue: NOT_FOUND")
}

func (unsupportedMoves) DeadLetter(context.Context, *ackwise.Message, dlq.Envelope) error {
	return fmt.Errorf("plain source: %w", errors.ErrUnsupported)
}
