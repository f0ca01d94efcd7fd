package gcppubsub

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/ackwise/ackwise/retry"
)

// defaultMaxDeliveryAttempts is what Pub/Sub uses for a DeadLetterPolicy
// whose MaxDeliveryAttempts is 0.
const defaultMaxDeliveryAttempts = 5

// maxDeliveryAttempts returns the subscription's dead-letter policy's
// MaxDeliveryAttempts (0 read as Pub/Sub's default, 5), and false without
// a dead-letter policy.
func maxDeliveryAttempts(ps *pubsubpb.Subscription) (int, bool) {
	dp := ps.GetDeadLetterPolicy()
	if dp == nil {
		return 0, false
	}
	if n := int(dp.GetMaxDeliveryAttempts()); n > 0 {
		return n, true
	}
	return defaultMaxDeliveryAttempts, true
}

// checkSubscription checks the subscription ps against cfg, as NewSource
// reads it: a dead-letter policy that disagrees with cfg.Retry.MaxAttempts
// is refused (an error naming both), a retry policy that cannot honour the
// consumer's delays and a MaxExtension below the longest hold in place are
// warnings on log, and so is a source with no dead-letter destination at
// all.
//
// Dead letters (cfg.DeadLetterTopic set: ackwise-managed; empty:
// broker-managed):
//   - ackwise-managed with a dead-letter policy on the subscription: Pub/Sub
//     forwards a message, without ackwise's envelope, once it was
//     delivered MaxDeliveryAttempts times. ackwise's max attempts must not
//     be above it (nor unlimited), or Pub/Sub forwards first; at or below
//     it, ackwise dead-letters on the delivery that uses its last attempt,
//     and the policy is a backstop (for a message a crashed or stopped
//     consumer never failed).
//   - broker-managed: Pub/Sub decides, after MaxDeliveryAttempts
//     deliveries; ackwise's max attempts must be equal to it, or ackwise
//     would give up before Pub/Sub forwards (the handler runs again on each
//     delivery left) or Pub/Sub before ackwise's attempts are spent.
func checkSubscription(cfg Config, ps *pubsubpb.Subscription, log *slog.Logger) error {
	m, policy := maxDeliveryAttempts(ps)
	if err := checkAttempts(ps, cfg.DeadLetterTopic, cfg.Retry.WithDefaults().MaxAttempts, m, policy, "Config.Retry.MaxAttempts, max_attempts="); err != nil {
		return err
	}
	if cfg.DeadLetterTopic == "" && !policy {
		log.Warn("gcppubsub: no dead-letter topic (dead_letter_topic=) and no dead-letter policy on the subscription: DeadLetter fails, and a message that keeps failing is delivered again for ever; fine for reading a dead-letter subscription with the dlq tools")
	}

	c := capabilities(ps)
	switch rp := ps.GetRetryPolicy(); {
	case c.Delay:
		if d := scheduleOf(cfg.Retry); len(d) > 0 && slices.ContainsFunc(d, func(d time.Duration) bool { return d != c.MaxDelay }) {
			log.Warn("gcppubsub: the subscription's retry policy redelivers a nacked message after a fixed backoff, whatever delay ackwise asks: the consumer's retry delays are honoured only when it retries in place (consumer.RetryInPlace)", "backoff", c.MaxDelay, "consumer_delays", d)
		}
	case rp != nil:
		log.Info("gcppubsub: the subscription's retry policy backs off exponentially (its own delays, not the ones ackwise asks), so the source cannot delay a redelivery: the consumer retries in place", "minimum_backoff", rp.GetMinimumBackoff().AsDuration(), "maximum_backoff", rp.GetMaximumBackoff().AsDuration())
	}
	if hold := cfg.holdInPlace(); hold > cfg.MaxExtension {
		log.Warn("gcppubsub: max_extension is below the longest the consumer may hold a delivery retrying in place (every attempt's handler timeout and the delays between them): a delivery held longer may be delivered again while its handler runs", "max_extension", cfg.MaxExtension, "hold", hold)
	}
	return nil
}

// scheduleOf returns the distinct delays (no jitter) of the schedule p
// sets, for its first retries (at most 16); none when p sets no schedule
// (no Tiers, InitialInterval, Multiplier, MaxInterval or Jitter): the
// consumer then takes the source's delay tiers as its schedule.
func scheduleOf(p retry.Policy) []time.Duration {
	if len(p.Tiers) == 0 && p.InitialInterval == 0 && p.Multiplier == 0 && p.MaxInterval == 0 && p.Jitter == 0 {
		return nil
	}
	p = p.WithDefaults()
	p.Jitter = retry.NoJitter
	n := 16
	if p.MaxAttempts != retry.Unlimited {
		n = min(n, p.MaxAttempts-1)
	}
	var out []time.Duration
	for a := 1; a <= n; a++ {
		if d := p.Delay(a); !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

// checkAttempts refuses max attempts (where names where they were set)
// that disagree with the subscription ps's dead-letter policy (m
// deliveries, when policy): with ackwise-managed dead letters (ownTopic
// set) they must not be above m nor unlimited, with broker-managed ones
// they must equal m.
func checkAttempts(ps *pubsubpb.Subscription, ownTopic string, maxAttempts, m int, policy bool, where string) error {
	attempts := fmt.Sprint(maxAttempts)
	if maxAttempts == retry.Unlimited {
		attempts = "unlimited"
	}
	dlTopic := ps.GetDeadLetterPolicy().GetDeadLetterTopic()
	switch {
	case ownTopic != "" && policy && (maxAttempts == retry.Unlimited || maxAttempts > m):
		return fmt.Errorf("gcppubsub: subscription %s has a dead-letter policy that forwards a message to %s after %d deliveries (MaxDeliveryAttempts), before ackwise's max attempts, %s (%s), would dead-letter it with its envelope to %s: set max attempts to at most %d, or raise the policy's MaxDeliveryAttempts", ps.GetName(), dlTopic, m, attempts, where, ownTopic, m)
	case ownTopic == "" && policy && maxAttempts != m:
		return fmt.Errorf("gcppubsub: subscription %s dead-letters through its dead-letter policy (no dead_letter_topic=: broker-managed) after %d deliveries (MaxDeliveryAttempts), but ackwise's max attempts are %s (%s): make them equal, or give a dead_letter_topic= for ackwise-managed dead letters", ps.GetName(), m, attempts, where)
	}
	return nil
}
