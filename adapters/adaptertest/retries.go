package adaptertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

func testCrashBeforeAck(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{Lease: time.Second})
	in := batch(1, 1)
	h.publish(t, f, in)
	src := f.NewSource(t)
	first := h.receiveOne(t, src)
	if first.ID != in[0].ID {
		t.Fatalf("received %s, want %s", first.ID, in[0].ID)
	}
	// The handler ran, the process died before the ack.
	if err := src.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	again := h.receiveOne(t, f.NewSource(t))
	if again.ID != in[0].ID || !bytes.Equal(again.Payload, in[0].Payload) {
		t.Fatalf("redelivered %s %q, want %s %q", again.ID, again.Payload, in[0].ID, in[0].Payload)
	}
	if caps := src.Capabilities(); caps.DeliveryCount && again.Attempt < 2 {
		t.Fatalf("redelivery attempt %d, want ≥ 2 on a broker that counts deliveries", again.Attempt)
	}
}

func testRedeliveryDelay(t *testing.T, h Harness) {
	const delay = 300 * time.Millisecond
	f := h.Open(t, FixtureConfig{DelayTiers: []time.Duration{delay}})
	src := f.NewSource(t)
	if !src.Capabilities().Delay {
		t.Skip("source cannot delay redelivery (Capabilities.Delay false): the engine retries in place; checked by AttemptCountIncrements")
	}
	in := batch(1, 1)
	h.publish(t, f, in)
	m := h.receiveOne(t, src)
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	at := time.Now()
	if err := src.Nack(ctx, m, delay); err != nil {
		t.Fatalf("nack: %v", err)
	}
	again := h.receiveOne(t, src)
	if waited := time.Since(at); waited < delay-20*time.Millisecond {
		t.Fatalf("redelivered after %v, want at least %v", waited, delay)
	}
	if again.ID != in[0].ID || again.Attempt != 2 {
		t.Fatalf("redelivered %s attempt %d, want %s attempt 2", again.ID, again.Attempt, in[0].ID)
	}
	if err := src.Ack(ctx, again); err != nil {
		t.Fatalf("ack: %v", err)
	}
}

func testAttempts(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{DelayTiers: []time.Duration{100 * time.Millisecond}})
	in := batch(1, 1)
	h.publish(t, f, in)
	rec := h.newRecorder(func(context.Context, *ackwise.Message) error { return errors.New("still down") })
	h.start(t, f.NewSource(t), rec, consumer.Config{Retry: retry.Policy{MaxAttempts: 3, InitialInterval: 50 * time.Millisecond, Jitter: retry.NoJitter}})
	rec.waitFor(t, "3 attempts", func() bool { return len(rec.seen) >= 3 })
	dl := h.waitDeadLetters(t, f, 1)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i, m := range rec.seen[:3] {
		if m.Attempt != i+1 {
			t.Fatalf("delivery %d had attempt %d", i+1, m.Attempt)
		}
	}
	env, err := dlq.Decode(dl[0].Headers)
	if err != nil {
		t.Fatal(err)
	}
	if env.Reason != dlq.ReasonMaxAttempts || env.Attempts != 3 {
		t.Fatalf("envelope reason %s attempts %d, want max-attempts 3", env.Reason, env.Attempts)
	}
	if !env.FirstFailure.Before(env.LastFailure) {
		t.Fatalf("first failure %v not before last %v", env.FirstFailure, env.LastFailure)
	}
}

func testDeadLetterEnvelope(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{})
	in := batch(1, 1)
	in[0].Payload = append([]byte{0xde, 0xad, 0xbe, 0xef, 0}, bytes.Repeat([]byte("x"), 4096)...)
	in[0].Headers.Set("x-tenant", "acme")
	h.publish(t, f, in)
	long := string(bytes.Repeat([]byte("e"), 5000))
	rec := h.newRecorder(func(context.Context, *ackwise.Message) error {
		return ackwise.Permanent(errors.New(long))
	})
	h.start(t, f.NewSource(t), rec, consumer.Config{Name: "billing", Version: "v1.2.3"})
	dl := h.waitDeadLetters(t, f, 1)[0]
	if !bytes.Equal(dl.Payload, in[0].Payload) {
		t.Fatalf("dead letter payload differs: %d bytes, want %d", len(dl.Payload), len(in[0].Payload))
	}
	if dl.Headers.Get("x-tenant") != "acme" || dl.Headers.Get("x-seq") != "0" {
		t.Fatalf("original headers lost: %v", dl.Headers)
	}
	if dl.Headers.Get(ackwise.HeaderEventID) != in[0].ID {
		t.Fatalf("event id header %q, want %q", dl.Headers.Get(ackwise.HeaderEventID), in[0].ID)
	}
	env, err := dlq.Decode(dl.Headers)
	if err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	seen := rec.seen[0]
	rec.mu.Unlock()
	switch {
	case env.Reason != dlq.ReasonPermanent:
		t.Errorf("reason %q", env.Reason)
	case env.ErrorClass != "permanent":
		t.Errorf("error class %q", env.ErrorClass)
	case len(env.Error) > dlq.MaxErrorLen || len(env.Error) < 100:
		t.Errorf("error text %d bytes, want bounded to %d", len(env.Error), dlq.MaxErrorLen)
	case env.Source != seen.Source || env.Source == "":
		t.Errorf("source %q, want %q", env.Source, seen.Source)
	case env.MessageID != seen.BrokerID:
		t.Errorf("message id %q, want %q", env.MessageID, seen.BrokerID)
	case env.Partition != seen.Partition || env.Offset != seen.Offset:
		t.Errorf("position %d@%d, want %d@%d", env.Partition, env.Offset, seen.Partition, seen.Offset)
	case env.Attempts != 1:
		t.Errorf("attempts %d", env.Attempts)
	case env.FirstFailure.IsZero() || env.LastFailure.IsZero():
		t.Errorf("failure times %v %v", env.FirstFailure, env.LastFailure)
	case env.Consumer != "billing" || env.ConsumerVersion != "v1.2.3":
		t.Errorf("consumer %q %q", env.Consumer, env.ConsumerVersion)
	}
}

func testPermanentAtOnce(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{})
	in := batch(3, 3)
	h.publish(t, f, in)
	rec := h.newRecorder(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == in[1].ID {
			return fmt.Errorf("decode: %w", ackwise.Permanent(errors.New("bad json")))
		}
		return nil
	})
	h.start(t, f.NewSource(t), rec, consumer.Config{})
	dl := h.waitDeadLetters(t, f, 1)
	rec.waitFor(t, "all handled", func() bool { return len(rec.byID) == 3 })
	if len(dl) != 1 || dl[0].Headers.Get(ackwise.HeaderEventID) != in[1].ID {
		t.Fatalf("dead letters %d, want only %s", len(dl), in[1].ID)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.byID[in[1].ID] != 1 {
		t.Fatalf("poison message handled %d times, want 1", rec.byID[in[1].ID])
	}
}
