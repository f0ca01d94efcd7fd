package producer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/internal/scope"
)

// InstrumentationName is the instrumentation scope name of the meter and the
// tracer of a Publisher (Config.MeterProvider, Config.TracerProvider). Its
// version is ackwise's module version.
const InstrumentationName = "github.com/ackwise/ackwise/producer"

// Instruments of Config.MeterProvider. Each carries
// messaging.destination.name and messaging.system when Config.Destination
// and Config.System are set.
const (
	// MetricPublished counts the messages a Publish call got confirmed
	// ({message}).
	MetricPublished = "ackwise.producer.published"
	// MetricFailed counts the messages a Publish call returned unconfirmed
	// ({message}), by error.type: the class of the message's last error
	// (transient, permanent, rate-limited, discard; ackwise.ClassOf).
	MetricFailed = "ackwise.producer.failed"
	// MetricPublishDuration is the time a Publish call took, every attempt
	// and backoff wait included (s); error.type (the class of its first
	// failed message's error) on a call that failed.
	MetricPublishDuration = "ackwise.producer.publish.duration"
)

// Attribute keys of the producer's metrics and span, from the
// OpenTelemetry messaging semantic conventions.
const (
	AttrDestination   = "messaging.destination.name"
	AttrSystem        = "messaging.system"
	AttrErrorType     = "error.type"
	AttrOperationType = "messaging.operation.type"
	AttrOperationName = "messaging.operation.name"
	AttrMessageID     = "messaging.message.id"
	AttrBatchCount    = "messaging.batch.message_count"
)

// publishBuckets are the OpenTelemetry messaging duration advice, in
// seconds.
var publishBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// telemetry is a Publisher's spans and metrics.
type telemetry struct {
	tracer    trace.Tracer // nil without Config.TracerProvider
	spanName  string
	spanAttrs []attribute.KeyValue

	published metric.Int64Counter
	failed    metric.Int64Counter
	duration  metric.Float64Histogram
	ok        metric.MeasurementOption                  // the destination's attributes
	byClass   [len(classNames)]metric.MeasurementOption // the same, with error.type
}

// classNames are the error classes, by ackwise.Class.
var classNames = [...]string{
	ackwise.ClassTransient:   ackwise.ClassTransient.String(),
	ackwise.ClassPermanent:   ackwise.ClassPermanent.String(),
	ackwise.ClassRateLimited: ackwise.ClassRateLimited.String(),
	ackwise.ClassDiscard:     ackwise.ClassDiscard.String(),
}

func newTelemetry(cfg Config) (*telemetry, error) {
	var base []attribute.KeyValue
	if cfg.Destination != "" {
		base = append(base, attribute.String(AttrDestination, cfg.Destination))
	}
	if cfg.System != "" {
		base = append(base, attribute.String(AttrSystem, cfg.System))
	}
	t := &telemetry{
		spanName: "publish",
		ok:       metric.WithAttributeSet(attribute.NewSet(base...)),
	}
	if cfg.Destination != "" {
		t.spanName = "publish " + cfg.Destination
	}
	for i, name := range classNames {
		t.byClass[i] = metric.WithAttributeSet(attribute.NewSet(append([]attribute.KeyValue{attribute.String(AttrErrorType, name)}, base...)...))
	}
	if cfg.TracerProvider != nil {
		t.tracer = cfg.TracerProvider.Tracer(InstrumentationName, trace.WithInstrumentationVersion(scope.Version()))
		t.spanAttrs = append(base,
			attribute.String(AttrOperationType, "send"),
			attribute.String(AttrOperationName, "publish"))
	}
	mp := cfg.MeterProvider
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	meter := mp.Meter(InstrumentationName, metric.WithInstrumentationVersion(scope.Version()))
	var err, e error
	t.published, e = meter.Int64Counter(MetricPublished, metric.WithUnit("{message}"),
		metric.WithDescription("Messages published and confirmed by the broker."))
	err = errors.Join(err, e)
	t.failed, e = meter.Int64Counter(MetricFailed, metric.WithUnit("{message}"),
		metric.WithDescription("Messages a Publish call returned unconfirmed, by the class of their error."))
	err = errors.Join(err, e)
	t.duration, e = meter.Float64Histogram(MetricPublishDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of a Publish call, retries included."),
		metric.WithExplicitBucketBoundaries(publishBuckets...))
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("producer: creating metric instruments: %w", err)
	}
	return t, nil
}

// start starts the span of a Publish call, when there is a tracer:
// a producer span named "publish <destination>", child of the span in ctx.
// The messages' traceparent is then this span's (InjectTrace).
func (t *telemetry) start(ctx context.Context) (context.Context, trace.Span) {
	if t.tracer == nil {
		return ctx, nil
	}
	return t.tracer.Start(ctx, t.spanName, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(t.spanAttrs...))
}

// identify sets the message ID, or the batch size, on span once the
// messages have their IDs.
func identify(span trace.Span, msgs []*ackwise.Message) {
	if span == nil {
		return
	}
	if len(msgs) == 1 {
		span.SetAttributes(attribute.String(AttrMessageID, msgs[0].ID))
	} else {
		span.SetAttributes(attribute.Int(AttrBatchCount, len(msgs)))
	}
}

// end records the outcome of a Publish call of n messages that began at
// start and ended with err, and ends span.
func (t *telemetry) end(ctx context.Context, span trace.Span, start time.Time, n int, err error) {
	elapsed := time.Since(start).Seconds()
	failures := adapters.PublishFailures(err, n)
	if len(failures) < n {
		t.published.Add(ctx, int64(n-len(failures)), t.ok)
	}
	var byClass [len(classNames)]int64
	for _, f := range failures {
		byClass[classOf(f.Err)]++
	}
	for c, k := range byClass {
		if k > 0 {
			t.failed.Add(ctx, k, t.byClass[c])
		}
	}
	class := 0
	if err != nil {
		class = classOf(err)
		if len(failures) > 0 {
			class = classOf(failures[0].Err)
		}
	}
	if err == nil {
		t.duration.Record(ctx, elapsed, t.ok)
	} else {
		t.duration.Record(ctx, elapsed, t.byClass[class])
	}
	if span == nil {
		return
	}
	if err != nil {
		span.SetAttributes(attribute.String(AttrErrorType, classNames[class]))
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// classOf is ackwise.ClassOf(err), as an index into classNames.
func classOf(err error) int {
	c := ackwise.ClassOf(err)
	if c < 0 || int(c) >= len(classNames) {
		return int(ackwise.ClassTransient)
	}
	return int(c)
}
