package producer_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/producer"
)

func TestInjectTrace(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ts, err := trace.ParseTraceState("vendor=abc")
	if err != nil {
		t.Fatal(err)
	}
	ctx := trace.ContextWithSpanContext(t.Context(), trace.SpanContext{}.WithTraceState(ts))
	ctx, span := tp.Tracer("test").Start(ctx, "publish orders")
	defer span.End()

	msg := &ackwise.Message{ID: "ev-1"} // nil headers: created
	producer.InjectTrace(ctx, msg)
	want := span.SpanContext()
	if got := msg.Headers.Get(ackwise.HeaderTraceparent); got != "00-"+want.TraceID().String()+"-"+want.SpanID().String()+"-01" {
		t.Fatalf("traceparent %q, want the span %v", got, want)
	}
	if got := msg.Headers.Get("tracestate"); got != "vendor=abc" {
		t.Errorf("tracestate %q, want vendor=abc", got)
	}
	// Round trip: what a consumer extracts is the producer's span.
	back := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), &msg.Headers))
	if back.TraceID() != want.TraceID() || back.SpanID() != want.SpanID() {
		t.Errorf("extracted %v, want %v", back, want)
	}

	kept := &ackwise.Message{Headers: ackwise.HeadersOf("a", "b")}
	producer.InjectTrace(ctx, kept)
	if kept.Headers.Get("a") != "b" || kept.Headers.Get(ackwise.HeaderTraceparent) == "" {
		t.Errorf("existing headers %v: want a=b kept and traceparent added", kept.Headers)
	}

	untouched := &ackwise.Message{}
	producer.InjectTrace(t.Context(), untouched)
	if untouched.Headers != nil {
		t.Errorf("no span in ctx: headers %v, want nil", untouched.Headers)
	}
	producer.InjectTrace(ctx, nil) // no panic
}
