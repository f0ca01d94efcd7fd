package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
)

// TestInPlaceRetryAfterNotCutToBrokerMaxDelay: an in-place retry (ordered
// source, key ordering) waits what RetryAfter asked for. The broker's
// MaxDelay limits Nack, not a wait in place; before, the wait was cut to it
// (a 1h RetryAfter waited the last retry tier, 1m, and spent an attempt).
func TestInPlaceRetryAfterNotCutToBrokerMaxDelay(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{Ordered: true, Log: true, Delay: true, MaxDelay: 20 * time.Millisecond}, msgs(1, 1)...)
	var mu sync.Mutex
	var times []time.Time
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		mu.Lock()
		defer mu.Unlock()
		times = append(times, time.Now())
		if len(times) == 1 {
			return ackwise.RetryAfter(errors.New("429"), 400*time.Millisecond)
		}
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{Ordering: consumer.OrderKey})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	if !src.waitSettled(1, 5*time.Second) {
		t.Fatal("not settled")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(src.nacked) != 0 {
		t.Fatalf("expected in-place retry, got nack")
	}
	if d := times[1].Sub(times[0]); d < 400*time.Millisecond {
		t.Fatalf("retried after %v, RetryAfter asked 400ms", d)
	}
}
