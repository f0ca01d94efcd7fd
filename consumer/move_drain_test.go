package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
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
