package consumer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/internal/scope"
)

// Instrument names and attribute keys of the [Observer] returned by
// [NewMetrics].
const (
	// MetricMessages counts handled messages by outcome ({message}).
	MetricMessages = "ackwise.consumer.messages"
	// MetricHandlerDuration is the handler's run time in seconds, recorded
	// once per run: not for released (the handler did not run), nor for a
	// failed move tried again (its run was recorded with its first
	// settle-failed).
	MetricHandlerDuration = "ackwise.consumer.handler.duration"
	// MetricRedeliveries counts deliveries other than the first
	// (Message.Attempt > 1) whose handler ran or that were released, once
	// per delivery: every outcome but retried, and not again for a failed
	// move tried again ({message}).
	MetricRedeliveries = "ackwise.consumer.redeliveries"

	// The gauges below are observed while Run runs, for the consumer whose
	// Config.Observer is the Observer of NewMetrics (see NewMetrics).

	// MetricLagAge is the age of the oldest message in flight, per source,
	// in seconds: now less its broker timestamp (Message.PublishedAt), or
	// less when the engine received it where the broker gave none; 0 when
	// none of the source's messages is in flight.
	MetricLagAge = "ackwise.consumer.lag.age"
	// MetricLagMessages is the backlog the source's broker reports
	// (WithBacklog), in messages.
	MetricLagMessages = "ackwise.consumer.lag.messages"
	// MetricDrainTime is the estimated time to drain the backlog, in
	// seconds (EstimateDrain over the WithBacklog samples); -1 when the
	// backlog does not shrink.
	MetricDrainTime = "ackwise.consumer.lag.drain_time"
	// MetricInFlight is the number of messages received and not yet
	// settled (Stats.InFlight).
	MetricInFlight = "ackwise.consumer.in_flight"
	// MetricWaiting is the number of messages waiting in place, in flight
	// without a worker: retries in place, held redeliveries of messages
	// whose settle failed, failed moves waiting to be tried again.
	MetricWaiting = "ackwise.consumer.waiting"
	// MetricBreakerHeld is the number of messages the open breaker holds
	// (Stats.Held).
	MetricBreakerHeld = "ackwise.consumer.breaker.held"
	// MetricBreakerState is the breaker's state: BreakerClosed (0),
	// BreakerHalfOpen (1: open, a probe running) or BreakerOpen (2).
	MetricBreakerState = "ackwise.consumer.breaker.state"
	// MetricBreakerTrips counts how often the breaker opened
	// (Stats.BreakerTrips).
	MetricBreakerTrips = "ackwise.consumer.breaker.trips"

	// AttrOutcome is the outcome name (Outcome.String: acked, retried,
	// dead-lettered, discarded, released, settle-failed).
	AttrOutcome = "ackwise.outcome"
	// AttrSource is the source the message came from (Message.Source), named
	// as in the OpenTelemetry messaging conventions.
	AttrSource = "messaging.destination.name"
	// AttrConsumer is the consumer name given to NewMetrics.
	AttrConsumer = "ackwise.consumer.name"
)

// MeterName is the instrumentation scope name of the meter NewMetrics uses.
// Its version is ackwise's module version, from the build info.
const MeterName = "github.com/ackwise/ackwise/consumer"

// Values of MetricBreakerState.
const (
	BreakerClosed   = 0
	BreakerHalfOpen = 1 // open, a probe running
	BreakerOpen     = 2
)

// maxCachedSources bounds the attribute sets kept per source. Sources are
// topics and queues, few in practice; past the bound, sets are built per call
// (correct, but allocating).
const maxCachedSources = 256

// durationBuckets follow the OpenTelemetry messaging process-duration
// advice, in seconds.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// metrics is the Observer NewMetrics returns.
type metrics struct {
	consumer attribute.KeyValue
	messages metric.Int64Counter
	duration metric.Float64Histogram
	redeliv  metric.Int64Counter

	// sources maps a source name to its precomputed options. It is copied
	// on write (rare: once per new source) so that Observe reads it with one
	// atomic load and no lock.
	sources atomic.Pointer[map[string]*sourceOpts]
	mu      sync.Mutex // serializes writers of sources

	meter  metric.Meter
	gauges gaugeInstruments
	opts   metricsOptions
	// claimed is set by the first consumer given this Observer (New): the
	// gauges describe one consumer.
	claimed atomic.Bool
}

// sourceOpts holds the measurement options of one source, built once.
type sourceOpts struct {
	add    [len(outcomeNames)][]metric.AddOption    // outcome, source, consumer
	record [len(outcomeNames)][]metric.RecordOption // the same sets
	redel  []metric.AddOption                       // source, consumer
}

// NewMetrics returns an [Observer] that records every outcome with the
// OpenTelemetry meter provider mp, for Config.Observer, and the consumer's
// gauges while Run runs (see below):
//
//   - ackwise.consumer.messages (counter, {message}): one per outcome, with
//     attributes ackwise.outcome, messaging.destination.name (the source)
//     and ackwise.consumer.name;
//   - ackwise.consumer.handler.duration (histogram, s): the handler's run
//     time, same attributes, once per run: for every outcome with a nonzero
//     elapsed (not released, nor a failed move tried again);
//   - ackwise.consumer.redeliveries (counter, {message}): outcomes other
//     than retried of deliveries with Attempt > 1 — messages that needed
//     more than one delivery — with the source and consumer attributes.
//     Retried outcomes are left out so that a message retried n times
//     counts once whether it waited in place or at the broker (an in-place
//     retry is reported under the attempt that failed, and its next
//     attempt is numbered when it wakes).
//
// Given as Config.Observer itself (not wrapped in an Observer of one's own),
// it also observes, while Run runs, the gauges of that consumer, each with
// the attribute ackwise.consumer.name:
//
//   - ackwise.consumer.lag.age (gauge, s), per messaging.destination.name:
//     the age of the oldest message in flight (received, not yet settled),
//     from its broker timestamp (Message.PublishedAt: the Kafka record
//     timestamp, the AMQP timestamp property, SQS SentTimestamp, the Pub/Sub
//     publish time), or from when the engine received it where the broker
//     gave none; 0 once none of the source's messages is in flight. A
//     timestamp later than its receipt counts from the receipt. Messages
//     the broker has not delivered yet are not seen: their count is
//     ackwise.consumer.lag.messages;
//   - ackwise.consumer.lag.messages (gauge, {message}) and
//     ackwise.consumer.lag.drain_time (gauge, s; -1 while the backlog does
//     not shrink), with WithBacklog only;
//   - ackwise.consumer.in_flight, ackwise.consumer.waiting (up-down
//     counters, {message}): messages in flight, and those of them waiting
//     in place (a retry in place, a held redelivery, a failed move);
//   - with Config.Breaker: ackwise.consumer.breaker.held (up-down counter,
//     {message}), ackwise.consumer.breaker.state (gauge: BreakerClosed,
//     BreakerHalfOpen, BreakerOpen) and ackwise.consumer.breaker.trips
//     (counter, {trip}).
//
// The gauges describe one consumer: an Observer given to several consumers
// observes the gauges of the first one created with it (New logs a warning
// for the others), and counts the outcomes of all. Keeping the lag costs
// dispatch a slot per message in a table the engine already locks for it,
// no allocation; a collection reads the table under the engine's lock.
//
// consumerName should be the consumer's Config.Name; empty means
// DefaultName. A nil mp means a no-op provider. Nothing global is read or
// set. An invalid option is an error naming it.
//
// The Observer is safe for concurrent use. Attribute sets are built once
// per source (up to 256 sources), under a lock taken only on a source's
// first message; after that Observe takes no lock of its own and does not
// allocate beyond what the provider's instruments do (none with the
// OpenTelemetry SDK).
func NewMetrics(mp metric.MeterProvider, consumerName string, opts ...MetricsOption) (Observer, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	if consumerName == "" {
		consumerName = DefaultName
	}
	meter := mp.Meter(MeterName, metric.WithInstrumentationVersion(scope.Version()))
	m := &metrics{consumer: attribute.String(AttrConsumer, consumerName), meter: meter}
	for _, o := range opts {
		if o != nil {
			o(&m.opts)
		}
	}
	if err := m.opts.validate(); err != nil {
		return nil, err
	}
	var err, e error
	m.messages, e = meter.Int64Counter(MetricMessages,
		metric.WithUnit("{message}"),
		metric.WithDescription("Messages handled by the consumer, by outcome."))
	err = errors.Join(err, e)
	m.duration, e = meter.Float64Histogram(MetricHandlerDuration,
		metric.WithUnit("s"),
		metric.WithDescription("Duration of the handler call, by outcome."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	m.redeliv, e = meter.Int64Counter(MetricRedeliveries,
		metric.WithUnit("{message}"),
		metric.WithDescription("Handled deliveries that were not the first attempt."))
	err = errors.Join(err, e, m.gauges.create(meter))
	if err != nil {
		return nil, errors.Join(errors.New("consumer: creating metric instruments"), err)
	}
	empty := map[string]*sourceOpts{}
	m.sources.Store(&empty)
	return m, nil
}

// Observe implements [Observer].
func (m *metrics) Observe(msg *ackwise.Message, o Outcome, elapsed time.Duration) {
	if o < 0 || int(o) >= len(outcomeNames) {
		return
	}
	var source string
	attempt := 0
	if msg != nil {
		source, attempt = msg.Source, msg.Attempt
	}
	so := m.optsFor(source)
	ctx := context.Background()
	m.messages.Add(ctx, 1, so.add[o]...)
	// A zero elapsed is an outcome without a run of its own: a release, or
	// a move tried again after it failed (its handler run was observed
	// with the first failure). One duration and at most one redelivery per
	// delivery: a released one counts, as its only outcome.
	if elapsed > 0 {
		m.duration.Record(ctx, elapsed.Seconds(), so.record[o]...)
	}
	if attempt > 1 && o != Retried && (elapsed > 0 || o == Released) {
		m.redeliv.Add(ctx, 1, so.redel...)
	}
}

// optsFor returns the options of source, building and caching them on first
// use.
func (m *metrics) optsFor(source string) *sourceOpts {
	if so, ok := (*m.sources.Load())[source]; ok {
		return so
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := *m.sources.Load()
	if so, ok := cur[source]; ok {
		return so
	}
	so := m.buildOpts(source)
	if len(cur) >= maxCachedSources {
		return so
	}
	next := make(map[string]*sourceOpts, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	next[source] = so
	m.sources.Store(&next)
	return so
}

func (m *metrics) buildOpts(source string) *sourceOpts {
	src := attribute.String(AttrSource, source)
	so := &sourceOpts{}
	for i, name := range outcomeNames {
		opt := metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrOutcome, name), src, m.consumer))
		so.add[i] = []metric.AddOption{opt}
		so.record[i] = []metric.RecordOption{opt}
	}
	so.redel = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(src, m.consumer))}
	return so
}
