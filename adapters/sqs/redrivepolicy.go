package sqs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// DeadLetterMode says who moves a message the consumer gave up on to a
// dead-letter queue.
type DeadLetterMode string

// The dead-letter modes.
const (
	// DeadLetterAckwise (the default): DeadLetter sends the message to
	// Config.DeadLetterQueueURL with the dlq envelope, then deletes it.
	DeadLetterAckwise DeadLetterMode = "ackwise"
	// DeadLetterBroker: the queue's RedrivePolicy moves the message, as
	// SQS holds it and without an envelope, once SQS received it
	// maxReceiveCount times; DeadLetter makes it visible again for that.
	DeadLetterBroker DeadLetterMode = "broker"
)

// maxReceiveCountLimit is SQS's largest maxReceiveCount.
const maxReceiveCountLimit = 1000

// validateDeadLetters checks the fields of c about dead letters beyond
// DeadLetterQueueURL.
func (c Config) validateDeadLetters() error {
	switch c.DeadLetters {
	case "", DeadLetterAckwise:
	case DeadLetterBroker:
		if c.DeadLetterQueueURL != "" {
			return errors.New("sqs: Config.DeadLetterQueueURL is for ackwise-managed dead letters: with Config.DeadLetters = broker the queue's RedrivePolicy names the dead-letter queue")
		}
		if c.MaxAttempts == retry.Unlimited {
			return fmt.Errorf("sqs: Config.MaxAttempts = %d (unlimited) with Config.DeadLetters = broker: SQS's maxReceiveCount is 1 to %d", c.MaxAttempts, maxReceiveCountLimit)
		}
	default:
		return fmt.Errorf("sqs: Config.DeadLetters = %q: want %q (default) or %q", c.DeadLetters, DeadLetterAckwise, DeadLetterBroker)
	}
	if c.MaxAttempts < retry.Unlimited {
		return fmt.Errorf("sqs: Config.MaxAttempts = %d: want the consumer's retry.Policy.MaxAttempts (≥ 1, 0: retry.DefaultMaxAttempts %d, or retry.Unlimited)", c.MaxAttempts, retry.DefaultMaxAttempts)
	}
	return nil
}

// redrivePolicy is a queue's RedrivePolicy attribute.
type redrivePolicy struct {
	DeadLetterTargetArn string `json:"deadLetterTargetArn"`
	// MaxReceiveCount is a number or a string holding one: SQS takes
	// both, and answers as it was given.
	MaxReceiveCount json.RawMessage `json:"maxReceiveCount"`
}

// parseRedrivePolicy returns the dead-letter queue's ARN and the
// maxReceiveCount of a RedrivePolicy attribute; ok is false when v is
// empty (no policy).
func parseRedrivePolicy(v string) (arn string, maxReceives int, ok bool, err error) {
	if v == "" {
		return "", 0, false, nil
	}
	var p redrivePolicy
	if err := json.Unmarshal([]byte(v), &p); err != nil {
		return "", 0, true, fmt.Errorf("RedrivePolicy %q is not JSON: %w", v, err)
	}
	raw := strings.Trim(string(p.MaxReceiveCount), `"`)
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 || n > maxReceiveCountLimit {
		return "", 0, true, fmt.Errorf("RedrivePolicy %q: maxReceiveCount %q is not 1 to %d", v, raw, maxReceiveCountLimit)
	}
	if !strings.HasPrefix(p.DeadLetterTargetArn, "arn:") {
		return "", 0, true, fmt.Errorf("RedrivePolicy %q: deadLetterTargetArn is not an ARN", v)
	}
	return p.DeadLetterTargetArn, n, true, nil
}

// queueOfARN returns the account and queue name of an SQS queue ARN
// (arn:PARTITION:sqs:REGION:ACCOUNT:NAME).
func queueOfARN(arn string) (account, name string, ok bool) {
	parts := strings.Split(arn, ":")
	if len(parts) != 6 || parts[0] != "arn" || parts[2] != "sqs" || parts[5] == "" {
		return "", "", false
	}
	return parts[4], parts[5], true
}

// checkDeadLetters reads the queue's RedrivePolicy (in attrs, as NewSource
// read them) and sets the source up for cfg's dead-letter mode: in broker
// mode it refuses a queue without a RedrivePolicy or whose maxReceiveCount
// is not the consumer's max attempts; in ackwise mode it warns when a
// RedrivePolicy would move messages before the consumer gives up, or when
// there is no dead-letter queue at all. In either mode it warns when the
// dead-letter queue keeps messages for less time than the queue.
func (s *Source) checkDeadLetters(ctx context.Context, cfg Config, attrs map[string]string) error {
	maxAttempts := cfg.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = retry.DefaultMaxAttempts
	}
	policy := attrs[string(types.QueueAttributeNameRedrivePolicy)]
	arn, maxReceives, hasPolicy, err := parseRedrivePolicy(policy)
	if err != nil {
		return fmt.Errorf("sqs: queue %s: %w", s.name, err)
	}
	if hasPolicy {
		s.maxReceives = maxReceives
	}
	dlqURL := s.dlqURL
	if cfg.DeadLetters == DeadLetterBroker {
		s.brokerDL = true
		switch {
		case !hasPolicy:
			return fmt.Errorf("sqs: queue %s has no RedrivePolicy: broker-managed dead letters (Config.DeadLetters = broker, URL parameter dlq_mode=broker) need one with maxReceiveCount %d, the consumer's max attempts (Config.MaxAttempts, URL parameter max_attempts)", s.name, maxAttempts)
		case maxReceives != maxAttempts:
			return fmt.Errorf("sqs: queue %s's RedrivePolicy has maxReceiveCount %d, but the consumer's max attempts (Config.MaxAttempts, URL parameter max_attempts) are %d: with broker-managed dead letters the two must agree, or SQS moves messages the consumer still retries (maxReceiveCount below) or the consumer hands back messages SQS does not move yet (above)", s.name, maxReceives, maxAttempts)
		}
		account, name, ok := queueOfARN(arn)
		if !ok {
			return fmt.Errorf("sqs: queue %s's RedrivePolicy names %q, not an SQS queue ARN", s.name, arn)
		}
		s.brokerDLQ = name
		out, err := s.client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name), QueueOwnerAWSAccountId: aws.String(account)})
		if err != nil {
			// The retention check below is advice: it needs the URL,
			// moving dead letters does not.
			s.log.Warn("sqs: cannot find the dead-letter queue of the RedrivePolicy to check its retention", slog.String(ackwise.LogKeySource, s.name), slog.String("dlq", name), slog.Any(ackwise.LogKeyError, err))
			return nil
		}
		dlqURL = aws.ToString(out.QueueUrl)
	} else {
		switch {
		case hasPolicy && maxReceives < maxAttempts:
			s.log.Warn("sqs: the queue's RedrivePolicy moves a message (without the ackwise envelope) before the consumer's max attempts are spent; raise its maxReceiveCount, or use dlq_mode=broker with max_attempts equal to it", slog.String(ackwise.LogKeySource, s.name), slog.Int("maxReceiveCount", maxReceives), slog.Int("max_attempts", maxAttempts))
		case dlqURL == "" && hasPolicy:
			s.log.Warn("sqs: no dead-letter queue (dlq=): DeadLetter fails and a poison message comes back after each visibility timeout until the queue's RedrivePolicy moves it; dlq_mode=broker makes that the explicit choice", slog.String(ackwise.LogKeySource, s.name))
		case dlqURL == "":
			s.log.Warn("sqs: no dead-letter queue (dlq=) and no RedrivePolicy: DeadLetter fails and a poison message comes back after each visibility timeout", slog.String(ackwise.LogKeySource, s.name))
		}
		if dlqURL == "" {
			return nil
		}
	}
	s.warnRetention(ctx, attrs, dlqURL)
	return nil
}

// warnRetention logs a warning when the queue of dlqURL keeps messages for
// less time than the source's queue (MessageRetentionPeriod, in attrs as
// NewSource read them). A dead letter SQS moves out of a standard queue
// keeps its first enqueue time, so it expires by the source's clock: a
// dead-letter queue with a shorter retention may delete it at once.
func (s *Source) warnRetention(ctx context.Context, attrs map[string]string, dlqURL string) {
	const attr = types.QueueAttributeNameMessageRetentionPeriod
	src, err := strconv.Atoi(attrs[string(attr)])
	if err != nil {
		return // not reported: nothing to compare
	}
	out, err := s.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(dlqURL), AttributeNames: []types.QueueAttributeName{attr}})
	if err != nil {
		s.log.Warn("sqs: cannot read the dead-letter queue's retention", slog.String(ackwise.LogKeySource, s.name), slog.String("dlq", queueName(dlqURL)), slog.Any(ackwise.LogKeyError, err))
		return
	}
	dead, err := strconv.Atoi(out.Attributes[string(attr)])
	if err != nil || dead >= src {
		return
	}
	s.log.Warn("sqs: the dead-letter queue keeps messages for less time than the queue (MessageRetentionPeriod): dead letters may be deleted before anyone looks at them (a standard queue's dead letters that SQS moves keep their first enqueue time); give the dead-letter queue the longer retention, up to 14 days",
		slog.String(ackwise.LogKeySource, s.name), slog.String("dlq", queueName(dlqURL)),
		slog.Duration("retention", time.Duration(src)*time.Second), slog.Duration("dlq_retention", time.Duration(dead)*time.Second))
}

// handBack is DeadLetter with broker-managed dead letters: it makes msg
// visible again at once (ChangeMessageVisibilityBatch to 0, shared as a
// Nack's), for SQS to move it to the RedrivePolicy's dead-letter queue on
// the receive after its maxReceiveCount-th; a message received fewer times
// (a permanent failure) is delivered, and handled, again until then. It
// logs the envelope's reason and error with the message ID: SQS moves the
// message as it holds it, and keeps neither.
func (s *Source) handBack(ctx context.Context, msg *ackwise.Message, env dlq.Envelope) error {
	r, err := s.begin(msg, "dead-letter")
	if err != nil {
		return err
	}
	if err := r.end(s.vis.do(ctx, "dead-letter", msg, r, 0)); err != nil {
		return err
	}
	s.log.Warn("sqs: dead letter handed back to the queue's RedrivePolicy: SQS moves it, without the envelope, on the receive after its maxReceiveCount-th",
		slog.String(ackwise.LogKeySource, s.name), slog.String("dlq", s.brokerDLQ),
		slog.String(ackwise.LogKeyEventID, msg.EventID()), slog.String(ackwise.LogKeyBrokerID, msg.BrokerID),
		slog.Int(ackwise.LogKeyAttempt, msg.Attempt), slog.String(ackwise.LogKeyReason, string(env.Reason)),
		slog.String(ackwise.LogKeyClass, env.ErrorClass), slog.String(ackwise.LogKeyError, env.Error))
	return nil
}

// CheckAttempts checks the consumer's max attempts (consumer.New gives
// them, adapters.AttemptsChecker) against the queue's RedrivePolicy, as
// NewSource checked Config.MaxAttempts: with broker-managed dead letters
// they must equal its maxReceiveCount (an error naming both); with
// ackwise-managed ones a maxReceiveCount below them is a warning.
func (s *Source) CheckAttempts(maxAttempts int) error {
	switch {
	case s.maxReceives == 0:
	case s.brokerDL && maxAttempts != s.maxReceives:
		return fmt.Errorf("sqs: queue %s's RedrivePolicy has maxReceiveCount %d, but the consumer's max attempts are %s: with broker-managed dead letters the two must agree", s.name, s.maxReceives, attemptsString(maxAttempts))
	case !s.brokerDL && (maxAttempts == retry.Unlimited || s.maxReceives < maxAttempts):
		s.log.Warn("sqs: the queue's RedrivePolicy moves a message (without the ackwise envelope) before the consumer's max attempts are spent; raise its maxReceiveCount, or use dlq_mode=broker with max attempts equal to it", slog.String(ackwise.LogKeySource, s.name), slog.Int("maxReceiveCount", s.maxReceives), slog.String("max_attempts", attemptsString(maxAttempts)))
	}
	return nil
}

// attemptsString names max attempts for a message: a number or
// "unlimited".
func attemptsString(n int) string {
	if n == retry.Unlimited {
		return "unlimited"
	}
	return strconv.Itoa(n)
}
