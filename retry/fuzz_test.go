package retry_test

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/ackwise/ackwise/retry"
)

// FuzzDelay: for any attempt number (a broker header or count) and any
// policy fields, validated or not, Delay, BackOff, Tier, Exhausted and
// Validate never panic, and every delay is within [0, the cap]: MaxInterval
// (defaulted) for the exponential schedule, the largest tier with Tiers.
// tiers holds up to 8 little-endian int64 durations.
func FuzzDelay(f *testing.F) {
	f.Add(1, 0, int64(0), int64(0), 0.0, 0.0, []byte(nil))
	f.Add(math.MaxInt, retry.Unlimited, int64(time.Second), int64(10*time.Minute), 2.0, 0.5, []byte(nil))
	f.Add(math.MinInt, 5, int64(-1), int64(-1), math.NaN(), math.NaN(), []byte(nil))
	f.Add(64, 0, int64(math.MaxInt64), int64(math.MaxInt64), math.Inf(1), 1.0, []byte(nil))
	f.Add(3, 0, int64(math.MinInt64), int64(math.MinInt64), -2.0, -1.0, []byte(nil))
	f.Add(2, 0, int64(1), int64(math.MaxInt64), math.MaxFloat64, math.MaxFloat64, []byte(nil))
	f.Add(1<<62, 0, int64(0), int64(0), 0.0, 0.0, binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, uint64(time.Second)), 1<<63))
	f.Fuzz(func(t *testing.T, attempt, maxAttempts int, initial, maxInterval int64, mult, jitter float64, tiers []byte) {
		p := retry.Policy{
			MaxAttempts: maxAttempts, InitialInterval: time.Duration(initial), MaxInterval: time.Duration(maxInterval),
			Multiplier: mult, Jitter: jitter,
		}
		for i := 0; i+8 <= len(tiers) && i < 64; i += 8 {
			p.Tiers = append(p.Tiers, time.Duration(binary.LittleEndian.Uint64(tiers[i:])))
		}
		_ = p.Validate()
		_ = p.Exhausted(attempt)
		hi := delayCap(p)
		if d := p.Delay(attempt); d < 0 || d > hi {
			t.Fatalf("%+v.Delay(%d) = %v, want within [0, %v]", p, attempt, d, hi)
		}
		if tier := p.Tier(attempt); tier < -1 || tier >= max(len(p.Tiers), 1) {
			t.Fatalf("%+v.Tier(%d) = %d", p, attempt, tier)
		}
		b := p.BackOff()
		expHi := max(p.WithDefaults().MaxInterval, 0)
		for range 3 {
			if d := b.NextBackOff(); d < 0 || d > expHi {
				t.Fatalf("%+v: BackOff wait %v, want within [0, %v]", p, d, expHi)
			}
		}
	})
}
