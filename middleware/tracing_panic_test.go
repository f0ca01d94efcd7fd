package middleware_test

import (
	"context"
	"runtime/debug"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
)

// TestTracingPanicMarksSpanFailed: a handler that panics is a failed call.
// The engine recovers the panic outside the middleware chain (and
// dead-letters the message by default), so the span Tracing ends on the way
// out must say so with status Error — not an unset status that reads as a
// success. The panic reaches the caller's recover unchanged, with the
// handler's frame still in its stack; it gets no ackwise.error.class, which
// the recovering engine decides (RetryPanics).
func TestTracingPanicMarksSpanFailed(t *testing.T) {
	t.Parallel()
	sr, tp := tracingSetup(t)
	h := middleware.Tracing(tp, middleware.TracingConfig{})(ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		panic("nil order")
	}))
	var got any
	var stack string
	func() {
		defer func() { got, stack = recover(), string(debug.Stack()) }() // the engine's recover
		_ = h.Handle(t.Context(), &ackwise.Message{ID: "ev-3", Source: "orders", Partition: -1, Offset: -1, Attempt: 1})
	}()
	if got != "nil order" {
		t.Fatalf("recovered %v, want the handler's panic value passed on unchanged", got)
	}
	if !strings.Contains(stack, "TestTracingPanicMarksSpanFailed.func1") {
		t.Errorf("the recovered stack lost the panicking handler's frame:\n%s", stack)
	}
	ended := sr.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans ended, want 1", len(ended))
	}
	s := ended[0]
	if s.Status().Code != codes.Error || !strings.Contains(s.Status().Description, "nil order") {
		t.Errorf("status %v after a panic, want Error naming the panic", s.Status())
	}
	if ev := s.Events(); len(ev) != 1 || ev[0].Name != "exception" {
		t.Errorf("events %v after a panic, want one exception event", ev)
	}
	if c, ok := attrsOf(s)[middleware.SpanAttrErrorClass]; ok {
		t.Errorf("%s = %q after a panic, want none (the recovering engine decides the class)", middleware.SpanAttrErrorClass, c.Emit())
	}
}
