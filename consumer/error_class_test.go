package consumer_test

import (
	"context"
	"errors"
	"slices"
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
