package retry_test

import (
	"math"
	"testing"
	"time"

	"github.com/ackwise/ackwise/retry"
)

// hostilePolicies are policies Validate refuses (or accepts at their
// extremes), as a caller who skips Validate may pass them.
var hostilePolicies = []retry.Policy{
	{},
	{MaxInterval: -time.Second},
	{MaxInterval: -time.Second, Jitter: retry.NoJitter},
	{InitialInterval: time.Hour, MaxInterval: time.Minute, Jitter: retry.NoJitter},
	{MaxInterval: math.MinInt64},
	{InitialInterval: -time.Second},
	{InitialInterval: math.MaxInt64, MaxInterval: math.MaxInt64},
	{InitialInterval: math.MinInt64, MaxInterval: math.MinInt64},
	{Multiplier: math.NaN()},
	{Multiplier: math.Inf(1)},
	{Multiplier: math.Inf(-1)},
	{Multiplier: -3},
	{Multiplier: 0.5},
	{Multiplier: math.MaxFloat64, MaxInterval: math.MaxInt64},
	{Jitter: math.NaN()},
	{Jitter: math.Inf(1)},
	{Jitter: -0.5},
	{Jitter: 7},
	{Jitter: math.MaxFloat64, MaxInterval: math.MaxInt64},
	{Tiers: []time.Duration{-time.Second}},
	{Tiers: []time.Duration{time.Second, math.MinInt64, math.MaxInt64}},
	{MaxAttempts: math.MinInt, Tiers: []time.Duration{0}},
}

// hostileAttempts are attempt numbers a broker header or count may give.
var hostileAttempts = []int{math.MinInt, -1, 0, 1, 2, 63, 64, 1024, 1 << 31, math.MaxInt - 1, math.MaxInt}

// TestDelayOfHostileInputsIsInRange: Delay never panics and never returns
// a negative delay or one above the policy's cap (MaxInterval, defaulted;
// the largest tier with Tiers), whatever the attempt number and whatever an
// unvalidated policy holds. Before, a negative MaxInterval or tier came
// back as a negative delay: a retry at once, without backoff.
func TestDelayOfHostileInputsIsInRange(t *testing.T) {
	t.Parallel()
	for _, p := range hostilePolicies {
		for _, a := range hostileAttempts {
			for range 20 { // jitter is random
				d := p.Delay(a)
				if lo, hi := time.Duration(0), delayCap(p); d < lo || d > hi {
					t.Fatalf("%+v.Delay(%d) = %v, want within [%v, %v]", p, a, d, lo, hi)
				}
			}
		}
		b := p.BackOff()
		for range 200 {
			if d := b.NextBackOff(); d < 0 || d > max(p.WithDefaults().MaxInterval, 0) {
				t.Fatalf("%+v: BackOff wait %v out of [0, MaxInterval]", p, d)
			}
		}
		for _, a := range hostileAttempts {
			_ = p.Exhausted(a)
			if tier := p.Tier(a); tier < -1 || tier >= max(len(p.Tiers), 1) {
				t.Fatalf("%+v.Tier(%d) = %d: out of range", p, a, tier)
			}
		}
	}
}

// delayCap is the largest delay p.Delay may return.
func delayCap(p retry.Policy) time.Duration {
	if len(p.Tiers) > 0 {
		return max(0, maxOf(p.Tiers))
	}
	return max(0, p.WithDefaults().MaxInterval)
}

func maxOf(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds[1:] {
		m = max(m, d)
	}
	return m
}
