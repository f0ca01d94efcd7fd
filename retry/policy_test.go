package retry_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise/retry"
)

func TestDelayGrowsAndIsCapped(t *testing.T) {
	t.Parallel()
	p := retry.Policy{InitialInterval: time.Second, Multiplier: 2, MaxInterval: 10 * time.Second, Jitter: retry.NoJitter}
	want := []time.Duration{1, 2, 4, 8, 10, 10}
	for i, w := range want {
		if got := p.Delay(i + 1); got != w*time.Second {
			t.Fatalf("Delay(%d) = %v, want %v", i+1, got, w*time.Second)
		}
	}
}

func TestJitterStaysInBounds(t *testing.T) {
	t.Parallel()
	p := retry.Policy{InitialInterval: time.Second, Jitter: 0.5}
	seen := map[time.Duration]bool{}
	for range 200 {
		d := p.Delay(1)
		if d < 500*time.Millisecond || d > 1500*time.Millisecond {
			t.Fatalf("Delay(1) = %v outside [0.5s, 1.5s]", d)
		}
		seen[d] = true
	}
	if len(seen) < 10 {
		t.Fatalf("only %d distinct delays in 200: no jitter", len(seen))
	}
}

func TestTiersRepeatTheLast(t *testing.T) {
	t.Parallel()
	p := retry.Policy{Tiers: []time.Duration{time.Minute, 10 * time.Minute, time.Hour}}
	for attempt, want := range map[int]time.Duration{1: time.Minute, 2: 10 * time.Minute, 3: time.Hour, 7: time.Hour} {
		if got := p.Delay(attempt); got != want {
			t.Fatalf("Delay(%d) = %v, want %v", attempt, got, want)
		}
	}
	if p.Tier(1) != 0 || p.Tier(9) != 2 {
		t.Fatalf("Tier(1)=%d Tier(9)=%d", p.Tier(1), p.Tier(9))
	}
	if (retry.Policy{}).Tier(1) != -1 {
		t.Fatal("Tier without tiers should be -1")
	}
}

func TestExhausted(t *testing.T) {
	t.Parallel()
	if (retry.Policy{}).Exhausted(4) || !(retry.Policy{}).Exhausted(5) {
		t.Fatal("default policy should give 5 attempts")
	}
	if (retry.Policy{MaxAttempts: retry.Unlimited}).Exhausted(1 << 20) {
		t.Fatal("unlimited policy exhausted")
	}
	if !(retry.Policy{MaxAttempts: 1}).Exhausted(1) {
		t.Fatal("MaxAttempts 1 should not retry")
	}
}

func TestValidateNamesFieldAndValue(t *testing.T) {
	t.Parallel()
	cases := []struct {
		p    retry.Policy
		want string
	}{
		{retry.Policy{MaxAttempts: -2}, "MaxAttempts = -2"},
		{retry.Policy{InitialInterval: -time.Second}, "InitialInterval = -1s"},
		{retry.Policy{Multiplier: 0.5}, "Multiplier = 0.5"},
		{retry.Policy{MaxInterval: -1}, "MaxInterval = -1ns"},
		{retry.Policy{InitialInterval: time.Hour, MaxInterval: time.Minute}, "InitialInterval = 1h0m0s is above MaxInterval = 1m0s"},
		{retry.Policy{Jitter: 1.5}, "Jitter = 1.5"},
		{retry.Policy{Tiers: []time.Duration{time.Second, 0}}, "Tiers[1] = 0s"},
	}
	for _, tc := range cases {
		err := tc.p.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.p, err, tc.want)
		}
	}
	if err := (retry.Policy{}).Validate(); err != nil {
		t.Fatalf("zero policy invalid: %v", err)
	}
}

// TestJitterNeverExceedsMaxInterval: MaxInterval caps any one delay, jitter
// included. Before, a capped delay was jittered upward past the cap (up to
// MaxInterval × (1+Jitter): 15m under the 10m default), both in Delay and in
// the BackOff the producer waits with.
func TestJitterNeverExceedsMaxInterval(t *testing.T) {
	t.Parallel()
	p := retry.Policy{InitialInterval: time.Second, MaxInterval: 2 * time.Second, Jitter: 0.5}
	for range 200 {
		for attempt := 1; attempt <= 6; attempt++ {
			if d := p.Delay(attempt); d > p.MaxInterval {
				t.Fatalf("Delay(%d) = %v above MaxInterval %v", attempt, d, p.MaxInterval)
			}
		}
		b := p.BackOff()
		for n := 1; n <= 6; n++ {
			if d := b.NextBackOff(); d > p.MaxInterval {
				t.Fatalf("BackOff wait %d = %v above MaxInterval %v", n, d, p.MaxInterval)
			}
		}
	}
}

// TestValidateInitialAboveDefaultMaxInterval: a MaxInterval left at zero
// means DefaultMaxInterval (10m) and caps the schedule as much as an explicit
// one, so an InitialInterval above it is refused like an explicit
// MaxInterval below it. Before, it passed and the policy silently ran 1h,
// then 10m, 10m… (now that the cap holds with jitter: 10m from the first).
func TestValidateInitialAboveDefaultMaxInterval(t *testing.T) {
	t.Parallel()
	p := retry.Policy{InitialInterval: time.Hour}
	const want = "InitialInterval = 1h0m0s is above MaxInterval = 10m0s"
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Validate(%+v) = %v, want %q (schedule it would run: %v, %v)", p, err, want, p.Delay(1), p.Delay(2))
	}
	if err := (retry.Policy{InitialInterval: retry.DefaultMaxInterval}).Validate(); err != nil {
		t.Fatalf("InitialInterval = DefaultMaxInterval refused: %v", err)
	}
}

// TestJitterAtTheCapStaysSpread: delays at MaxInterval are still spread by
// jitter, not cut to the cap (which would make half the retries of messages
// that failed together fall due at the same instant).
func TestJitterAtTheCapStaysSpread(t *testing.T) {
	t.Parallel()
	p := retry.Policy{InitialInterval: time.Second, MaxInterval: 2 * time.Second, Jitter: 0.5}
	atCap := 0
	const n = 400
	for range n {
		d := p.Delay(6) // 32s before the cap
		if d < time.Second || d > p.MaxInterval {
			t.Fatalf("Delay(6) = %v, want within [MaxInterval*(1-Jitter), MaxInterval] = [1s, 2s]", d)
		}
		if d == p.MaxInterval {
			atCap++
		}
	}
	if atCap > n/20 {
		t.Fatalf("%d of %d delays exactly at MaxInterval: jitter no longer spreads them", atCap, n)
	}
}
