package consumer_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// Retries through a source with tiered delays (retry topics, wait queues)
// walk the tiers when the policy sets no schedule of its own: attempt n
// waits tier n, the last repeating. Before, the default exponential
// schedule (1s, 2s, 4s, 8s) was rounded up by the source to its first tier
// every time, and the chain's later tiers were never used. A policy with a
// schedule of its own keeps it.
func TestRetryWalksTheSourceTiers(t *testing.T) {
	t.Parallel()
	tiers := []time.Duration{time.Minute, 10 * time.Minute}
	for _, tc := range []struct {
		name   string
		policy retry.Policy
		want   []time.Duration // the delays asked of Nack at attempts 1-4
	}{
		{"no schedule", retry.Policy{}, []time.Duration{time.Minute, 10 * time.Minute, 10 * time.Minute, 10 * time.Minute}},
		{"attempts only", retry.Policy{MaxAttempts: 3}, []time.Duration{time.Minute, 10 * time.Minute}},
		{"own interval", retry.Policy{InitialInterval: time.Second, Jitter: retry.NoJitter}, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}},
		{"own tiers", retry.Policy{Tiers: []time.Duration{time.Second}}, []time.Duration{time.Second, time.Second, time.Second, time.Second}},
		{"own jitter", retry.Policy{Jitter: retry.NoJitter}, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var msgs []*ackwise.Message
			for a := 1; a <= 4; a++ {
				msgs = append(msgs, &ackwise.Message{ID: "m" + strconv.Itoa(a), Source: "q", Partition: -1, Offset: -1, Attempt: a})
			}
			src := newFakeSource(adapters.Capabilities{Delay: true, DelayTiers: tiers}, msgs...)
			c, err := consumer.New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
				return errors.New("transient")
			}), consumer.Config{RetryMode: consumer.RetryBroker, Retry: tc.policy})
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, c)
			if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.Retried+s.DeadLettered == 4 }) {
				t.Fatalf("stats %+v", c.Stats())
			}
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			src.mu.Lock()
			defer src.mu.Unlock()
			got := make([]time.Duration, 4)
			for _, n := range src.nacked {
				got[n.msg.Attempt-1] = n.delay
			}
			got = got[:len(src.nacked)]
			if !slices.Equal(got, tc.want) {
				t.Errorf("delays asked of the source at attempts 1-%d: %v, want %v", len(got), got, tc.want)
			}
		})
	}
}

// RetryAuto retries through the broker when the source has delay tiers (the
// adapter was given retry topics or wait queues), even on a source that
// delivers keys in order; without tiers it keeps the rule of before: in
// place on an ordered source, through the broker where it can delay, else
// in place. RetryInPlace stays in place whatever the tiers.
func TestRetryAutoFollowsTiers(t *testing.T) {
	t.Parallel()
	tiers := []time.Duration{time.Minute}
	for _, tc := range []struct {
		name   string
		caps   adapters.Capabilities
		mode   consumer.RetryMode
		broker bool
	}{
		{"ordered with tiers", adapters.Capabilities{Log: true, Ordered: true, Delay: true, DelayTiers: tiers, MaxDelay: time.Minute}, consumer.RetryAuto, true},
		{"ordered without tiers", adapters.Capabilities{Log: true, Ordered: true}, consumer.RetryAuto, false},
		{"ordered, delay without tiers", adapters.Capabilities{Ordered: true, Delay: true}, consumer.RetryAuto, false},
		{"unordered with tiers", adapters.Capabilities{Delay: true, DelayTiers: tiers}, consumer.RetryAuto, true},
		{"unordered, delay without tiers", adapters.Capabilities{Delay: true}, consumer.RetryAuto, true},
		{"unordered without delay", adapters.Capabilities{}, consumer.RetryAuto, false},
		{"ordered with tiers, in place asked", adapters.Capabilities{Log: true, Ordered: true, Delay: true, DelayTiers: tiers}, consumer.RetryInPlace, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src := newFakeSource(tc.caps, msgs(1, 1)...)
			c, err := consumer.New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
				return errors.New("transient")
			}), consumer.Config{RetryMode: tc.mode, Clock: memory.NewVirtualClock(time.Time{})})
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, c)
			if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.Retried == 1 }) {
				t.Fatalf("stats %+v: want one retry", c.Stats())
			}
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			src.mu.Lock()
			defer src.mu.Unlock()
			if broker := len(src.nacked) == 1; broker != tc.broker {
				t.Fatalf("retried through the broker (Nack): %v, want %v", broker, tc.broker)
			}
		})
	}
}
