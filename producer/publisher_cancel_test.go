package producer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/retry"
)

// TestLastErrorKeptOnCancel: when ctx ends while Publish waits for the next
// attempt, the error still wraps the broker's (before, only ctx's).
func TestLastErrorKeptOnCancel(t *testing.T) {
	b, sink := setup(t)
	if _, err := b.InjectFault("orders", memory.Fault{Kind: memory.FaultFailPublish}); err != nil {
		t.Fatal(err)
	}
	p, _ := producer.New(sink, producer.Config{Retry: retry.Policy{InitialInterval: time.Second, Jitter: retry.NoJitter}})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := p.Publish(ctx, &ackwise.Message{ID: "e1"})
	if !errors.Is(err, memory.ErrInjected) {
		t.Fatalf("Publish = %v, want it to wrap the broker's error", err)
	}
}
