package retry

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Defaults applied by [Policy.WithDefaults] to zero fields.
const (
	DefaultMaxAttempts     = 5
	DefaultInitialInterval = time.Second
	DefaultMultiplier      = 2.0
	DefaultMaxInterval     = 10 * time.Minute
	DefaultJitter          = 0.5
)

// Unlimited as MaxAttempts retries transient failures forever.
const Unlimited = -1

// Policy says how often and how late a failed message is retried. The zero
// value means the documented defaults.
type Policy struct {
	// MaxAttempts is the total number of deliveries a message gets, the first
	// included, before it is dead-lettered with reason max-attempts. Zero means
	// DefaultMaxAttempts (5); Unlimited (-1) never gives up; 1 means no retry.
	MaxAttempts int
	// InitialInterval is the delay after the first failure. Zero means
	// DefaultInitialInterval (1s).
	InitialInterval time.Duration
	// Multiplier grows the delay after each further failure. Zero means
	// DefaultMultiplier (2); otherwise it must be at least 1.
	Multiplier float64
	// MaxInterval caps any one delay. Zero means DefaultMaxInterval (10m).
	MaxInterval time.Duration
	// Jitter is the randomization factor in [0, 1]: a delay d becomes a random
	// value in [d*(1-Jitter), d*(1+Jitter)], which spreads out retries of
	// messages that failed together; a value above MaxInterval is mirrored
	// below it (2*MaxInterval - value), so delays at the cap stay spread. Zero means
	// DefaultJitter (0.5); NoJitter (-1) turns it off.
	Jitter float64
	// Tiers, when set, replaces the exponential schedule: the delay after
	// failed attempt n is Tiers[n-1], and the last tier repeats. Retry-topic
	// chains and wait queues use one topic or queue per tier. Jitter does not
	// apply to tiers.
	Tiers []time.Duration
}

// NoJitter as Policy.Jitter turns jitter off.
const NoJitter = -1

// WithDefaults returns p with its zero fields set to the defaults.
func (p Policy) WithDefaults() Policy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.InitialInterval == 0 {
		p.InitialInterval = DefaultInitialInterval
	}
	if p.Multiplier == 0 {
		p.Multiplier = DefaultMultiplier
	}
	if p.MaxInterval == 0 {
		p.MaxInterval = DefaultMaxInterval
	}
	if p.Jitter == 0 {
		p.Jitter = DefaultJitter
	}
	return p
}

// Validate reports the first bad field, naming it and its value.
func (p Policy) Validate() error {
	switch {
	case p.MaxAttempts < Unlimited:
		return fmt.Errorf("retry: MaxAttempts = %d: must be positive, 0 (default) or -1 (unlimited)", p.MaxAttempts)
	case p.InitialInterval < 0:
		return fmt.Errorf("retry: InitialInterval = %v: must not be negative", p.InitialInterval)
	// Written so that NaN, which passes no comparison, fails them.
	case p.Multiplier != 0 && !(p.Multiplier >= 1):
		return fmt.Errorf("retry: Multiplier = %v: must be at least 1", p.Multiplier)
	case p.MaxInterval < 0:
		return fmt.Errorf("retry: MaxInterval = %v: must not be negative", p.MaxInterval)
	case p.InitialInterval > cmp.Or(p.MaxInterval, DefaultMaxInterval):
		// A zero MaxInterval is DefaultMaxInterval, and caps as much.
		return fmt.Errorf("retry: InitialInterval = %v is above MaxInterval = %v", p.InitialInterval, cmp.Or(p.MaxInterval, DefaultMaxInterval))
	case p.Jitter != NoJitter && !(p.Jitter >= 0 && p.Jitter <= 1):
		return fmt.Errorf("retry: Jitter = %v: must be in [0, 1] or -1 (none)", p.Jitter)
	}
	for i, t := range p.Tiers {
		if t <= 0 {
			return fmt.Errorf("retry: Tiers[%d] = %v: must be positive", i, t)
		}
	}
	return nil
}

// Exhausted reports whether a message whose attempt number attempt just
// failed has used up its attempts.
func (p Policy) Exhausted(attempt int) bool {
	max := p.WithDefaults().MaxAttempts
	return max != Unlimited && attempt >= max
}

// Delay returns how long to wait before redelivering a message whose attempt
// number attempt (1-based) just failed. It costs the same for any attempt:
// the attempt number comes from the broker (a header, a delivery count) and
// may be huge; an attempt below 1 counts as 1. The result is never negative
// and never above MaxInterval (with Tiers: the tier), also for a policy
// Validate would refuse (a negative MaxInterval or tier gives 0, a NaN
// Multiplier or Jitter a delay in range).
func (p Policy) Delay(attempt int) time.Duration {
	p = p.WithDefaults()
	if attempt < 1 {
		attempt = 1
	}
	if len(p.Tiers) > 0 {
		return max(p.Tiers[min(attempt, len(p.Tiers))-1], 0)
	}
	return p.expDelay(attempt)
}

// Tier returns the index into Tiers used after failed attempt attempt, or -1
// without tiers. Retry-topic chains route by it.
func (p Policy) Tier(attempt int) int {
	if len(p.Tiers) == 0 {
		return -1
	}
	return min(max(attempt, 1), len(p.Tiers)) - 1
}

// BackOff returns the exponential schedule as a backoff.BackOff for code that
// retries in process (a short in-handler retry, a reconnect loop): its n-th
// wait is what Delay(n) gives without Tiers. It never stops on its own; wrap it with
// backoff.WithMaxRetries to bound it.
func (p Policy) BackOff() backoff.BackOff {
	return &schedule{p: p.WithDefaults()}
}

type schedule struct {
	p Policy
	n int
}

func (s *schedule) NextBackOff() time.Duration {
	s.n = min(s.n+1, math.MaxInt-1)
	return s.p.expDelay(s.n)
}

func (s *schedule) Reset() { s.n = 0 }

// expDelay is the exponential schedule's delay after failed attempt
// attempt (at least 1) of a defaulted p: InitialInterval ×
// Multiplier^(attempt-1), capped at MaxInterval, then jittered. It is
// computed at once in floating point rather than step by step (a loop over
// a huge attempt number would hang its worker), and never overflows (a
// MaxInterval near the largest Duration, jittered upward, came out
// negative). A jittered value above MaxInterval is mirrored below it
// (2*MaxInterval - value) rather than cut to it: cut, half the retries at
// the cap would fall due at the same instant, which is what jitter is there
// to prevent.
func (p Policy) expDelay(attempt int) time.Duration {
	if p.MaxInterval <= 0 { // unvalidated: nothing but 0 is in range
		return 0
	}
	maxI := float64(p.MaxInterval)
	d := math.Min(float64(p.InitialInterval)*math.Pow(p.Multiplier, float64(attempt-1)), maxI)
	if p.Jitter != NoJitter {
		d += d * p.Jitter * (2*rand.Float64() - 1)
		if d > maxI {
			d = 2*maxI - d
		}
	}
	switch {
	case d >= maxI: // float64(MaxInterval) may round above it
		return p.MaxInterval
	case !(d > 0): // also a NaN of an unvalidated policy
		return 0
	}
	return time.Duration(d)
}
