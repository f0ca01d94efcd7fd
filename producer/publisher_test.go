package producer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/retry"
)

func setup(t *testing.T) (*memory.Broker, *memory.Sink) {
	t.Helper()
	b, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CreateQueue("orders", memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	sink, err := b.Sink("orders")
	if err != nil {
		t.Fatal(err)
	}
	return b, sink
}

// A confirmation lost after the broker stored the message: the retry
// publishes a copy with the same event ID, which a consumer's inbox absorbs.
func TestRetryAfterLostConfirmationKeepsTheEventID(t *testing.T) {
	t.Parallel()
	b, sink := setup(t)
	if _, err := b.InjectFault("orders", memory.Fault{Kind: memory.FaultFailPublish, AfterStore: true, Count: 1}); err != nil {
		t.Fatal(err)
	}
	p, err := producer.New(sink, producer.Config{Retry: retry.Policy{InitialInterval: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	msg := &ackwise.Message{Key: "cust-1", Payload: []byte(`{"cents":100}`)}
	if err := p.Publish(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	if msg.ID == "" {
		t.Fatal("no event ID assigned")
	}
	stored, err := b.Messages("orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 2 {
		t.Fatalf("stored %d copies, want 2 (the lost confirmation and the retry)", len(stored))
	}
	for _, m := range stored {
		if m.ID != msg.ID || m.Headers.Get(ackwise.HeaderEventID) != msg.ID {
			t.Fatalf("copy has ID %q / header %q, want %q", m.ID, m.Headers.Get(ackwise.HeaderEventID), msg.ID)
		}
	}
}

func TestGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	b, sink := setup(t)
	if _, err := b.InjectFault("orders", memory.Fault{Kind: memory.FaultFailPublish}); err != nil {
		t.Fatal(err)
	}
	p, err := producer.New(sink, producer.Config{Retry: retry.Policy{MaxAttempts: 4, InitialInterval: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Publish(context.Background(), &ackwise.Message{ID: "e1"})
	if !errors.Is(err, memory.ErrInjected) || !strings.Contains(err.Error(), "after 4 attempt(s)") {
		t.Fatalf("Publish = %v, want the injected error after 4 attempts", err)
	}
}

func TestPermanentFailureIsNotRetried(t *testing.T) {
	t.Parallel()
	b, sink := setup(t)
	if _, err := b.InjectFault("orders", memory.Fault{Kind: memory.FaultFailPublish, Err: ackwise.Permanent(errors.New("message too large"))}); err != nil {
		t.Fatal(err)
	}
	p, err := producer.New(sink, producer.Config{Retry: retry.Policy{InitialInterval: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(context.Background(), &ackwise.Message{ID: "e1"}); err == nil || !strings.Contains(err.Error(), "after 1 attempt(s)") {
		t.Fatalf("Publish = %v, want one attempt", err)
	}
}

func TestEventIDsAreUniqueAndKept(t *testing.T) {
	t.Parallel()
	_, sink := setup(t)
	p, err := producer.New(sink, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	a, b, keep := &ackwise.Message{}, &ackwise.Message{}, &ackwise.Message{ID: "mine"}
	if err := p.Publish(context.Background(), a, b, keep); err != nil {
		t.Fatal(err)
	}
	if a.ID == "" || a.ID == b.ID || keep.ID != "mine" {
		t.Fatalf("IDs %q %q %q", a.ID, b.ID, keep.ID)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	_, sink := setup(t)
	if _, err := producer.New(nil, producer.Config{}); err == nil {
		t.Error("nil sink accepted")
	}
	if _, err := producer.New(sink, producer.Config{Retry: retry.Policy{MaxAttempts: retry.Unlimited}}); err == nil || !strings.Contains(err.Error(), "MaxAttempts = -1") {
		t.Errorf("unlimited attempts: %v", err)
	}
	if _, err := producer.New(sink, producer.Config{Retry: retry.Policy{Jitter: 3}}); err == nil || !strings.Contains(err.Error(), "Jitter = 3") {
		t.Errorf("bad jitter: %v", err)
	}
	// Tiers are for redelivery through a broker; a publish retries in
	// process, and used to ignore them silently.
	if _, err := producer.New(sink, producer.Config{Retry: retry.Policy{Tiers: []time.Duration{time.Second}}}); err == nil || !strings.Contains(err.Error(), "Retry.Tiers") {
		t.Errorf("tiers: %v", err)
	}
	p, _ := producer.New(sink, producer.Config{})
	if err := p.Publish(context.Background(), nil); err == nil {
		t.Error("nil message accepted")
	}
}
