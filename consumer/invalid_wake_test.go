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

// revokingSource is a fakeSource that tells the engine when receipts are
// lost (adapters.Invalidator), as a Kafka revoke or a dead RabbitMQ channel
// does, and refuses every dead letter when refuse is set.
type revokingSource struct {
	*fakeSource
	refuse    bool
	onInvalid atomic.Pointer[func()]
}

func (s *revokingSource) OnInvalid(f func()) { s.onInvalid.Store(&f) }

func (s *revokingSource) Extensions() adapters.Extensions {
	return adapters.Extensions{Invalidator: s}
}

func (s *revokingSource) DeadLetter(ctx context.Context, m *ackwise.Message, env dlq.Envelope) error {
	if s.refuse {
		return errors.New("dead-letter publish: refused")
	}
	return s.fakeSource.DeadLetter(ctx, m, env)
}

// revoke loses the receipts of msgs and tells the engine.
func (s *revokingSource) revoke(msgs ...*ackwise.Message) {
	for _, m := range msgs {
		s.lose(m)
	}
	if f := s.onInvalid.Load(); f != nil && *f != nil {
		(*f)()
	}
}

// A message waiting in place (a retry, a failed move) on a clock that never
// moves is handed back as soon as the source says its receipt is lost, not
// when its wait ends, and so is the message of its key queued behind it;
// each observed as a hand-back is: the waiting one not again, the queued
// one as Released. A receipt lost while the handler runs, before the wait
// begins, is not missed.
func TestLostReceiptEndsWaitInPlace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		refuse bool  // dead letters refused: the move waits
		during bool  // the receipts are lost while the handler runs
		fail   error // the first message's handler error
		want   func(consumer.Stats) bool
	}{
		{"retry", false, false, ackwise.RetryAfter(errors.New("429"), time.Hour), retriedOnce},
		{"retry lost while running", false, true, ackwise.RetryAfter(errors.New("429"), time.Hour), retriedOnce},
		{"move", true, false, ackwise.Permanent(errors.New("invalid order")), func(s consumer.Stats) bool { return s.Retried == 0 && s.SettleFailed == 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ms := msgs(2, 1) // one key: the second waits behind the first
			src := &revokingSource{fakeSource: newFakeSource(adapters.Capabilities{Ordered: true, Log: true}, ms...), refuse: tc.refuse}
			clock := memory.NewVirtualClock(time.Time{})
			var runs atomic.Int32
			h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
				runs.Add(1)
				if tc.during {
					src.revoke(ms...)
				}
				return tc.fail
			})
			c, err := consumer.New(src, h, consumer.Config{Ordering: consumer.OrderKey, Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, c)
			if !tc.during {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := clock.WaitForTimers(ctx, 1); err != nil {
					t.Fatalf("the first message does not wait: %v", err)
				}
				src.revoke(ms...)
			}
			if !src.waitReleased(2, 5*time.Second) {
				t.Fatalf("released %v after the receipts were lost, want both messages", src.released)
			}
			if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.InFlight == 0 }) {
				t.Fatalf("stats %+v: messages still in flight", c.Stats())
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			s := c.Stats()
			if !tc.want(s) || s.Released != 1 || s.Acked+s.DeadLettered+s.Discarded != 0 || runs.Load() != 1 {
				t.Fatalf("stats %+v, %d handler runs: want the first message observed once (as its wait began), the second released unrun", s, runs.Load())
			}
			src.mu.Lock()
			defer src.mu.Unlock()
			if len(src.released) != 2 || src.released[0] != ms[0] || src.released[1] != ms[1] {
				t.Fatalf("released %v, want the first message, then the second", src.released)
			}
		})
	}
}

func retriedOnce(s consumer.Stats) bool { return s.Retried == 1 && s.SettleFailed == 0 }
