package rabbitmq

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// InstrumentationName names the meter and the tracer of the package.
const InstrumentationName = "github.com/ackwise/ackwise/adapters/rabbitmq"

// The spans of Config.TracerProvider and SinkConfig.TracerProvider, of
// kind producer, with the attributes messaging.system ("rabbitmq"),
// messaging.destination.name (the queue or exchange), and
// messaging.message.id (a move's event ID) or messaging.batch.message_count
// (a Publish's messages).
const (
	// SpanNack is a Nack's move of a copy to its wait queue.
	SpanNack = "rabbitmq nack"
	// SpanDeadLetter is a DeadLetter's move of a copy to the dead-letter
	// queue.
	SpanDeadLetter = "rabbitmq dead-letter"
	// SpanPublish is a Sink's Publish.
	SpanPublish = "rabbitmq publish"
)

func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	return tp.Tracer(InstrumentationName)
}

// startSpan starts a producer span named name publishing to dest.
func startSpan(ctx context.Context, t trace.Tracer, name, dest string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return t.Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(append(attrs,
		attribute.String("messaging.system", "rabbitmq"),
		attribute.String("messaging.destination.name", dest))...))
}

// endSpan ends span, marking it failed with err unless err is nil.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
