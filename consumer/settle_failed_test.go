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
	"github.com/ackwise/ackwise/consumer"
)

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

// refusingMoves refuses every dead letter, its deliveries staying valid (a
// dead-letter queue that does not exist, say).
type refusingMoves struct{ *fakeSource }

// unsupportedMoves cannot dead-letter at all (a plain RabbitMQ queue: its
// DeadLetter returns an error wrapping errors.ErrUnsupported).
type unsupportedMoves struct{ *fakeSource }

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
