package consumer_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// TestInPlaceRetryOfTheLargestAttemptDoesNotWrap: a source hands over the
// attempt number it read from the broker (a retry topic's ackwise-attempt,
// a delivery count), which a producer can set as high as it likes. With
// unlimited attempts, a message delivered as attempt MaxInt is retried in
// place; its next attempt stays MaxInt. Before, it wrapped to MinInt, which
// the retry policy reads as attempt 1.
func TestInPlaceRetryOfTheLargestAttemptDoesNotWrap(t *testing.T) {
	t.Parallel()
	m := msgs(1, 1)[0]
	m.Attempt = math.MaxInt
	src := newFakeSource(adapters.Capabilities{Ordered: true}, m)
	var mu sync.Mutex
	var attempts []int
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, m.Attempt)
		if len(attempts) < 3 {
			return errors.New("transient")
		}
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{
		Ordering: consumer.OrderKey,
		Retry:    retry.Policy{MaxAttempts: retry.Unlimited, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, Jitter: retry.NoJitter},
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	if !src.waitSettled(1, 10*time.Second) {
		t.Fatal("not settled")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(src.acked) != 1 || len(src.nacked) != 0 {
		t.Fatalf("acked %d, nacked %d: want one ack after retries in place", len(src.acked), len(src.nacked))
	}
	for i, a := range attempts {
		if a != math.MaxInt {
			t.Fatalf("run %d saw attempt %d, want %d (saturated); all: %v", i+1, a, math.MaxInt, attempts)
		}
	}
}
