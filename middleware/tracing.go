package middleware

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise"
)

// TracerName is the instrumentation scope name of the tracer [Tracing] uses.
const TracerName = "github.com/ackwise/ackwise/middleware"

// Span attribute keys [Tracing] sets, after the OpenTelemetry messaging
// semantic conventions where one exists.
const (
	SpanAttrSystem        = "messaging.system"
	SpanAttrDestination   = "messaging.destination.name"
	SpanAttrMessageID     = "messaging.message.id"
	SpanAttrOperationType = "messaging.operation.type"
	SpanAttrOperationName = "messaging.operation.name"
	SpanAttrPartition     = "messaging.destination.partition.id"
	SpanAttrKafkaOffset   = "messaging.kafka.offset"
	SpanAttrAttempt       = "ackwise.attempt"
	SpanAttrErrorClass    = "ackwise.error.class"
)

// TracingConfig configures [Tracing]. The zero value means the documented
// defaults.
type TracingConfig struct {
	// System is the messaging.system attribute ("kafka", "rabbitmq",
	// "aws_sqs", "gcp_pubsub"). Default empty: the attribute is left out.
	System string
	// Propagator extracts the parent span context from the message headers.
	// Default propagation.TraceContext{} (headers traceparent and
	// tracestate). The global propagator is never used.
	Propagator propagation.TextMapPropagator
	// SpanName names a message's span. Default "process <Message.Source>",
	// the messaging conventions' "{operation} {destination}".
	SpanName func(msg *ackwise.Message) string
	// Attributes are added to every span (for example
	// messaging.consumer.group.name). Default none.
	Attributes []attribute.KeyValue
}

// Tracing returns middleware that runs each handler call in a span of kind
// consumer, started with tp's tracer; nothing global is used. A nil tp means
// no tracing: the handler is returned unchanged, at no cost. The span's parent is the trace context found in the
// message headers (W3C traceparent and tracestate by default); without one,
// the span is a child of the span in ctx, if any, else a new root. The
// handler's ctx carries the span, so its own spans and
// producer.InjectTrace nest under it.
//
// Attributes: messaging.destination.name (Message.Source),
// messaging.message.id (the event ID), messaging.operation.type and
// messaging.operation.name ("process"), ackwise.attempt, and, when
// Message.Partition >= 0, messaging.destination.partition.id and
// messaging.kafka.offset. A failed call sets the span status to Error,
// records the error as an event and sets ackwise.error.class
// (ackwise.ClassOf). A panic passing through is a failed call too: status
// Error, the panic recorded as an exception event (by the SDK), and the panic
// passed on unchanged; it has no ackwise.error.class, since whoever recovers
// it decides (consumer.Config.RetryPanics). Payloads and header values other than the trace context
// are never recorded.
//
// The span covers the middleware inside it and the handler, not the
// engine's settle (ack, retry, dead letter), which happens after the
// middleware chain returns; put Tracing first in Config.Middleware so the
// other middleware runs inside the span. The handler's error is returned
// unchanged. Safe for concurrent use.
func Tracing(tp trace.TracerProvider, cfg TracingConfig) ackwise.Middleware {
	if tp == nil {
		return func(next ackwise.Handler) ackwise.Handler { return next }
	}
	tracer := tp.Tracer(TracerName)
	prop := cfg.Propagator
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	static := []attribute.KeyValue{
		attribute.String(SpanAttrOperationType, "process"),
		attribute.String(SpanAttrOperationName, "process"),
	}
	if cfg.System != "" {
		static = append(static, attribute.String(SpanAttrSystem, cfg.System))
	}
	static = append(static, cfg.Attributes...)
	return func(next ackwise.Handler) ackwise.Handler {
		return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
			ctx = prop.Extract(ctx, headerCarrier{&msg.Headers})
			name := "process " + msg.Source
			if cfg.SpanName != nil {
				name = cfg.SpanName(msg)
			}
			attrs := make([]attribute.KeyValue, 0, len(static)+5)
			attrs = append(attrs, static...)
			attrs = append(attrs,
				attribute.String(SpanAttrDestination, msg.Source),
				attribute.String(SpanAttrMessageID, msg.EventID()),
				attribute.Int(SpanAttrAttempt, msg.Attempt),
			)
			if msg.Partition >= 0 {
				attrs = append(attrs, attribute.String(SpanAttrPartition, strconv.Itoa(int(msg.Partition))))
				if msg.Offset >= 0 {
					attrs = append(attrs, attribute.Int64(SpanAttrKafkaOffset, msg.Offset))
				}
			}
			ctx, span := tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
			// Deferred directly, End records a panic passing through as an
			// exception event (the OpenTelemetry SDK does) but leaves the
			// status unset: the deferred func below marks the span failed
			// and passes the panic on unchanged to the engine's recover.
			defer span.End()
			defer func() {
				if v := recover(); v != nil {
					span.SetStatus(codes.Error, fmt.Sprintf("handler panicked: %v", v))
					panic(v)
				}
			}()
			err := next.Handle(ctx, msg)
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
				span.SetAttributes(attribute.String(SpanAttrErrorClass, ackwise.ClassOf(err).String()))
			}
			return err
		})
	}
}

// headerCarrier reads and writes trace context in ackwise.Headers. Get falls
// back to a case-insensitive match, as some brokers or senders change the
// case of header names.
type headerCarrier struct{ h *ackwise.Headers }

func (c headerCarrier) Get(key string) string {
	if v, ok := c.h.Lookup(key); ok {
		return v
	}
	h := *c.h
	for i := len(h) - 1; i >= 0; i-- { // the last match, as Headers.Get
		if strings.EqualFold(h[i].Key, key) {
			return h[i].Value
		}
	}
	return ""
}

func (c headerCarrier) Set(key, value string) { c.h.Set(key, value) }

func (c headerCarrier) Keys() []string { return c.h.Keys() }
