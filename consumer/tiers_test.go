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
