package producer

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise"
)

// InjectTrace writes the span context of ctx into msg.Headers as W3C trace
// context (headers traceparent and, when set, tracestate), so that the
// consumer's middleware.Tracing continues the trace. msg is left unchanged
// when ctx carries no valid span context, and when msg already carries a
// traceparent (a forwarded message, an outbox row: the trace it belongs to
// is the one it started in, and a new traceparent beside its old tracestate
// would be a mismatched pair). The global propagator is not used. Call it
// before Publish, once per message; it is safe for concurrent use on
// different messages.
func InjectTrace(ctx context.Context, msg *ackwise.Message) {
	if msg == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	for _, h := range msg.Headers {
		// Any case: the consumer's tracing middleware matches
		// traceparent case-insensitively, and would follow a second,
		// lowercase one added beside a forwarded "Traceparent".
		if strings.EqualFold(h.Key, ackwise.HeaderTraceparent) {
			return
		}
	}
	propagation.TraceContext{}.Inject(ctx, &msg.Headers)
}
