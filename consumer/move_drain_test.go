package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// failingDeadLetter refuses every dead letter, as a dead-letter
// destination that is down does; the receipt stays valid.
type failingDeadLetter struct{ *fakeSource }

func (failingDeadLetter) DeadLetter(context.Context, *ackwise.Message, dlq.Envelope) error {
	return errors.New("dead-letter publish: refused")
}

// A message whose failed dead letter waits to be tried again when the drain
// times out (another handler is stuck, ignoring its context) is handed back
// by the release of what is still queued, observed once, as SettleFailed:
// not again as Released.
func TestPendingMoveAtDrainTimeoutObservedOnce(t *testing.T) {
	t.Parallel()
	poison := &ackwise.Message{ID: "poison", Key: "p", Source: "q", Partition: -1, Offset: -1, Attempt: 1}
	stuck := &ackwise.Message{ID: "stuck", Key: "s", Source: "q", Partition: -1, Offset: -1, Attempt: 1}
	src := newFakeSource(adapters.Capabilities{Delay: true}, poison, stuck)
	started, unblock := make(chan struct{}), make(chan struct{})
	obs := &outcomeLog{}
	c, err := consumer.New(failingDeadLetter{src}, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == "stuck" {
			close(started)
			<-unblock // ignores its context
			return nil
		}
		return ackwise.Permanent(errors.New("invalid order"))
	}), consumer.Config{Concurrency: 1, DrainTimeout: time.Millisecond, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	defer close(unblock)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	// The one worker runs the poison first, whose dead letter fails and
	// waits, then the stuck message; the poison's next try queues behind it.
	<-started
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.SettleFailed >= 1 }) {
		t.Fatalf("the dead letter was not tried; stats %+v", c.Stats())
	}
	cancel()
	if err := <-done; !errors.Is(err, consumer.ErrDrainTimeout) {
		t.Fatalf("Run = %v, want ErrDrainTimeout", err)
	}
	s := c.Stats()
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for _, o := range obs.all {
		if o != consumer.SettleFailed {
			t.Fatalf("outcomes observed %v, stats %+v: want only SettleFailed, the poison handed back unobserved", obs.all, s)
		}
	}
	if s.Released != 0 || s.SettleFailed != uint64(len(obs.all)) {
		t.Fatalf("stats %+v, observed %v: want SettleFailed only", s, obs.all)
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if len(src.released) != 1 || src.released[0] != poison {
		t.Fatalf("released %v: want the poison, once", src.released)
	}
}

// A probe of the open breaker that fails permanently, and whose dead letter
// is refused, tells nothing about the dependency: while its dead letter
// waits to be tried again, the next held message is probed, and its success
// closes the breaker. Before, the waiting move kept the probe's place: as
// long as the dead-letter destination refused, no other probe ran and
// consumption stayed paused.
func TestProbeWithPendingMoveProbesNext(t *testing.T) {
	t.Parallel()
	clock := memory.NewVirtualClock(time.Time{})
	src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(3, 3)...)
	var calls atomic.Int64
	c, err := consumer.New(failingDeadLetter{src}, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		switch calls.Add(1) {
		case 1, 2, 3: // the first is nacked, the next two open the breaker
			return errDown
		case 4: // the first probe: a poison message
			return ackwise.Permanent(errors.New("bad payload"))
		}
		return nil
	}), consumer.Config{
		Concurrency: 2,
		Ordering:    consumer.OrderNone,
		Clock:       clock,
		Breaker:     &consumer.Breaker{Threshold: 2, ProbeInterval: time.Second, MaxProbeInterval: 4 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.Paused && s.Held == 2 }) {
		t.Fatalf("breaker did not open holding 2: %+v", c.Stats())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		t.Fatal("probe timer not armed")
	}
	clock.Advance(time.Second) // the first probe
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.SettleFailed >= 1 }) {
		t.Fatalf("the probe's dead letter was not tried: %+v", c.Stats())
	}
	for range 10 {
		clock.Advance(4 * time.Second) // any later probe interval, and the move's pauses
		if waitStats(c, 200*time.Millisecond, func(s consumer.Stats) bool { return !s.Paused }) {
			break
		}
	}
	if s := c.Stats(); s.Paused || calls.Load() != 5 || s.Acked != 1 {
		t.Fatalf("stats %+v, %d handler calls: want the next held message probed and acked, the breaker closed", s, calls.Load())
	}
}
