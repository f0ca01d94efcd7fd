package retry_test

import (
	"math"
	"testing"
	"time"

	"github.com/ackwise/ackwise/retry"
)

// TestDelayOfAHugeAttemptReturns: the attempt number comes from the broker
// (Kafka's ackwise-attempt header, a delivery count), and with Unlimited
// attempts any number reaches Delay. Before, Delay stepped the schedule once
// per attempt: about 2s for attempt 2^24 here, and a header of 2^62 hung the
// worker for good.
func TestDelayOfAHugeAttemptReturns(t *testing.T) {
	t.Parallel()
	p := retry.Policy{MaxAttempts: retry.Unlimited, Jitter: retry.NoJitter}
	got := make(chan time.Duration, 1)
	go func() { got <- p.Delay(1 << 62) }()
	select {
	case d := <-got:
		if d != retry.DefaultMaxInterval {
			t.Fatalf("Delay(2^62) = %v, want the cap %v", d, retry.DefaultMaxInterval)
		}
	case <-time.After(10 * time.Second): // a bound on a hang; it returns in microseconds
		t.Fatal("Delay(2^62) did not return within 10s")
	}
}

// TestDelayWithTheLargestMaxInterval: a MaxInterval of the largest Duration
// ("no cap") is valid. Before, a delay at the cap jittered upward overflowed
// and Delay returned about -292 years about half the time: the engine
// retried at once, without backoff.
func TestDelayWithTheLargestMaxInterval(t *testing.T) {
	t.Parallel()
	p := retry.Policy{MaxInterval: math.MaxInt64, Multiplier: 1 << 20, Jitter: 0.5}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	b := p.BackOff()
	for range 100 {
		for _, attempt := range []int{1, 4, 70} {
			if d := p.Delay(attempt); d < 0 {
				t.Fatalf("Delay(%d) = %v: negative", attempt, d)
			}
		}
		if d := b.NextBackOff(); d < 0 {
			t.Fatalf("BackOff wait = %v: negative", d)
		}
	}
}
