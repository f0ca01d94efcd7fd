package producer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/retry"
)

// DefaultMaxAttempts is how often Publish tries by default.
const DefaultMaxAttempts = 3

// Config configures a Publisher. The zero value means the documented
// defaults.
type Config struct {
	// Retry says how often and how late a failed publish is tried again.
	// Zero MaxAttempts means DefaultMaxAttempts (3); InitialInterval defaults
	// to 100ms here, MaxInterval to 5s (or InitialInterval, if longer).
	// Unlimited is refused: a publish must end; so are Tiers, which are for
	// redelivery through a broker (a publish waits in process).
	Retry retry.Policy
	// NewID returns a new event ID. Default NewEventID (a UUIDv7).
	NewID func() string

	// MeterProvider, when set, records ackwise.producer.published,
	// ackwise.producer.failed (by error.type, the error's class) and
	// ackwise.producer.publish.duration; see MetricPublished. Nil: no
	// metrics.
	MeterProvider metric.MeterProvider
	// TracerProvider, when set, wraps each Publish call in a span of kind
	// producer named "publish <Destination>" ("publish" without one), with
	// messaging.operation.type "send" and messaging.operation.name
	// "publish" (the OpenTelemetry messaging conventions), the destination
	// and system attributes, and messaging.message.id (one message) or
	// messaging.batch.message_count; the messages' traceparent is then this
	// span's, so the consumer's span follows it. Nil: no span, and the
	// messages carry the trace context of ctx as it is.
	TracerProvider trace.TracerProvider
	// Destination names the sink's topic or queue in the span and the
	// metrics (messaging.destination.name). Default empty: left out.
	Destination string
	// System is messaging.system in the span and the metrics ("kafka",
	// "rabbitmq", "aws_sqs", "gcp_pubsub"). Default empty: left out.
	System string
}

// Publisher publishes messages through a sink with stable event IDs. It is
// safe for concurrent use.
type Publisher struct {
	sink  adapters.Sink
	retry retry.Policy
	newID func() string
	tel   *telemetry
}

// New returns a Publisher on sink. It does not take ownership of sink.
func New(sink adapters.Sink, cfg Config) (*Publisher, error) {
	if sink == nil {
		return nil, errors.New("producer: sink is nil")
	}
	// The producer's own interval defaults come before Validate, which
	// would otherwise hold an InitialInterval to the policy's default
	// MaxInterval instead of this one, which follows it.
	if cfg.Retry.InitialInterval == 0 {
		cfg.Retry.InitialInterval = 100 * time.Millisecond
	}
	if cfg.Retry.MaxInterval == 0 {
		cfg.Retry.MaxInterval = max(5*time.Second, cfg.Retry.InitialInterval)
	}
	if err := cfg.Retry.Validate(); err != nil {
		return nil, fmt.Errorf("producer: Retry: %w", err)
	}
	if len(cfg.Retry.Tiers) > 0 {
		return nil, fmt.Errorf("producer: Retry.Tiers = %v: a publish retries in process on the exponential schedule; set InitialInterval, Multiplier and MaxInterval instead", cfg.Retry.Tiers)
	}
	if cfg.Retry.MaxAttempts == retry.Unlimited {
		return nil, fmt.Errorf("producer: Retry.MaxAttempts = %d: a publish must end; give a positive number", cfg.Retry.MaxAttempts)
	}
	if cfg.Retry.MaxAttempts == 0 {
		cfg.Retry.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.NewID == nil {
		cfg.NewID = NewEventID
	}
	tel, err := newTelemetry(cfg)
	if err != nil {
		return nil, err
	}
	return &Publisher{sink: sink, retry: cfg.Retry.WithDefaults(), newID: cfg.NewID, tel: tel}, nil
}

// NewEventID returns a new event ID: a UUIDv7, unique and ordered by time.
func NewEventID() string {
	id, err := uuid.NewV7()
	if err != nil {
		// NewV7 fails only when the system's random source does.
		return uuid.NewString()
	}
	return id.String()
}

// Publish publishes msgs and returns once the broker confirmed every one.
// The span in ctx, if any, is written into each message's traceparent header
// (InjectTrace) unless it has one. Messages without an ID (msg.ID or the
// ackwise-event-id header) get one first (Publish sets msg.ID), so every retry
// — this call's own, or the caller's after an error — carries the same ID.
// When the sink reports which messages failed (adapters.PublishError), only
// those are tried again, and the error Publish returns wraps an
// adapters.PublishError whose indexes are into msgs and list only the
// messages that failed in the end; the others were confirmed. A failure
// marked ackwise.Permanent or a closed sink ends the retries of its
// message (of every message, for an error that stands for the whole
// batch) at once, while the other failed messages are retried; a done ctx
// ends them all. A failure marked ackwise.RetryAfter(err, d) makes the
// next try wait at least d; when d is longer than the policy's MaxInterval,
// Publish returns the error at once instead of blocking that long (the
// caller reads d back with ackwise.RetryAfterOf). A listed message may
// still have been published (its confirm was lost); publishing it again is
// safe because its ID is stable. adapters.PublishFailures tells which to
// publish again. With Config.TracerProvider the call is a span, and the
// traceparent written is the span's; with Config.MeterProvider its outcome
// is counted.
func (p *Publisher) Publish(ctx context.Context, msgs ...*ackwise.Message) error {
	for i, m := range msgs {
		if m == nil {
			return fmt.Errorf("producer: message %d is nil", i)
		}
	}
	start := time.Now()
	ctx, span := p.tel.start(ctx)
	for _, m := range msgs {
		// An ID only in the header (a forwarded or redriven message, an
		// outbox row) is the event's: keep it, and make it the message's.
		if id := m.EventID(); id == "" {
			m.ID = p.newID()
		} else if m.ID == "" {
			m.ID = id
		}
		InjectTrace(ctx, m)
	}
	identify(span, msgs)
	err := p.publish(ctx, msgs)
	p.tel.end(ctx, span, start, len(msgs), err)
	return err
}

// publish publishes msgs, which have their IDs, with the retries Publish
// documents.
func (p *Publisher) publish(ctx context.Context, msgs []*ackwise.Message) error {
	wait := &atLeast{BackOff: p.retry.BackOff()}
	b := backoff.WithContext(backoff.WithMaxRetries(wait, uint64(p.retry.MaxAttempts-1)), ctx)
	attempt := 0
	todo := make([]int, len(msgs)) // indexes into msgs of the messages to publish next
	for i := range todo {
		todo[i] = i
	}
	errs := make([]error, len(msgs)) // each message's last error; nil once confirmed
	batch := make([]*ackwise.Message, 0, len(msgs))
	partial := false // the sink reported per message (adapters.PublishError)
	var last error   // the broker's: backoff returns only ctx's when ctx ends in a wait
	err := backoff.Retry(func() error {
		attempt++
		batch = batch[:0]
		for _, k := range todo {
			batch = append(batch, msgs[k])
			errs[k] = nil
		}
		err := p.sink.Publish(ctx, batch...)
		if _, ok := errors.AsType[*adapters.PublishError](err); ok {
			partial = true
		}
		stop := ctx.Err() != nil
		again := todo[:0:0]
		for _, f := range adapters.PublishFailures(err, len(batch)) {
			k := todo[f.Index]
			errs[k] = f.Err
			if errors.Is(f.Err, adapters.ErrClosed) || ackwise.ClassOf(f.Err) == ackwise.ClassPermanent {
				continue // not worth another try
			}
			if d, ok := ackwise.RetryAfterOf(f.Err); ok {
				if d > p.retry.MaxInterval {
					stop = true // not worth blocking the caller
				}
				wait.min = max(wait.min, d)
			}
			again = append(again, k)
		}
		todo = again
		// A sink that never reported per message failed each whole
		// batch: its error is the result, as it was.
		last = err
		if partial {
			last = adapters.NewPublishError(errs)
		}
		if last != nil && (stop || len(todo) == 0) {
			return backoff.Permanent(last)
		}
		return last
	}, b)
	if err != nil && last != nil && !errors.Is(err, last) {
		err = errors.Join(err, last)
	}
	if err != nil {
		return fmt.Errorf("producer: publish failed after %d attempt(s): %w", attempt, err)
	}
	return nil
}

// atLeast is a BackOff whose next wait is at least min, the delay the last
// failure asked for (ackwise.RetryAfter); min holds for one wait.
type atLeast struct {
	backoff.BackOff
	min time.Duration
}

func (a *atLeast) NextBackOff() time.Duration {
	d := a.BackOff.NextBackOff()
	if d != backoff.Stop && d < a.min {
		d = a.min
	}
	a.min = 0
	return d
}
