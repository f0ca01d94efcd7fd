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
const MeterName = "github.com/ackwise/ackwise/consumer"

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
}

// sourceOpts holds the measurement options of one source, built once.
type sourceOpts struct {
	add    [len(outcomeNames)][]metric.AddOption    // outcome, source, consumer
	record [len(outcomeNames)][]metric.RecordOption // the same sets
	redel  []metric.AddOption                       // source, consumer
}

// NewMetrics returns an [Observer] that records every outcome with the
// OpenTelemetry meter provider mp, for Config.Observer:
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
// consumerName should be the consumer's Config.Name; empty means
// DefaultName. A nil mp means a no-op provider. Nothing global is read or
// set.
//
// The Observer is safe for concurrent use. Attribute sets are built once
// per source (up to 256 sources), under a lock taken only on a source's
// first message; after that Observe takes no lock of its own and does not
// allocate beyond what the provider's instruments do (none with the
// OpenTelemetry SDK).
func NewMetrics(mp metric.MeterProvider, consumerName string) (Observer, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	if consumerName == "" {
		consumerName = DefaultName
	}
	meter := mp.Meter(MeterName)
	m := &metrics{consumer: attribute.String(AttrConsumer, consumerName)}
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
	err = errors.Join(err, e)
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
