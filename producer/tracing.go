package producer

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise"
)

// InjectTrace writes the span context of ctx into msg.Headers as W3C trace
// context (headers traceparent and, when set, tracestate), so that the
// consumer's middleware.Tracing continues the trace. When ctx carries no valid span context, msg is left unchanged (an
// existing traceparent, as on a forwarded message, is kept). The global
// propagator is not used. Call it before Publish, once per message; it is
// safe for concurrent use on different messages.
func InjectTrace(ctx context.Context, msg *ackwise.Message) {
	if msg == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagation.TraceContext{}.Inject(ctx, &msg.Headers)
}
