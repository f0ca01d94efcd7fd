package middleware_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/producer"
)

const (
	parentTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentSpan  = "00f067aa0ba902b7"
)

func tracingSetup(t *testing.T) (*tracetest.SpanRecorder, trace.TracerProvider) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return sr, tp
}

func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestTracingParentFromTraceparent(t *testing.T) {
	t.Parallel()
	sr, tp := tracingSetup(t)
	var inHandler trace.SpanContext
	h := middleware.Tracing(tp, middleware.TracingConfig{System: "kafka"})(ackwise.HandlerFunc(func(ctx context.Context, _ *ackwise.Message) error {
		inHandler = trace.SpanContextFromContext(ctx)
		return nil
	}))
	msg := &ackwise.Message{
		ID: "ev-1", Source: "orders", Partition: 3, Offset: 42, Attempt: 2,
		Payload: []byte("secret-payload"),
		Headers: ackwise.HeadersOf(ackwise.HeaderTraceparent, "00-"+parentTrace+"-"+parentSpan+"-01", "tracestate", "vendor=abc", "authorization", "secret-header"),
	}
	if err := h.Handle(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
	spans := sr.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans ended, want 1", len(spans))
	}
	s := spans[0]
	if s.Name() != "process orders" || s.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("span %q kind %v, want \"process orders\" consumer", s.Name(), s.SpanKind())
	}
	if got := s.Parent(); got.TraceID().String() != parentTrace || got.SpanID().String() != parentSpan || !got.IsRemote() {
		t.Errorf("parent %v/%v remote=%v, want %s/%s remote", got.TraceID(), got.SpanID(), got.IsRemote(), parentTrace, parentSpan)
	}
	if s.SpanContext().TraceState().Get("vendor") != "abc" {
		t.Errorf("tracestate %q not carried over", s.SpanContext().TraceState())
	}
	if inHandler.SpanID() != s.SpanContext().SpanID() {
		t.Error("handler ctx does not carry the consumer span")
	}
	want := map[attribute.Key]attribute.Value{
		middleware.SpanAttrSystem:        attribute.StringValue("kafka"),
		middleware.SpanAttrDestination:   attribute.StringValue("orders"),
		middleware.SpanAttrMessageID:     attribute.StringValue("ev-1"),
		middleware.SpanAttrOperationType: attribute.StringValue("process"),
		middleware.SpanAttrOperationName: attribute.StringValue("process"),
		middleware.SpanAttrAttempt:       attribute.IntValue(2),
		middleware.SpanAttrPartition:     attribute.StringValue("3"),
		middleware.SpanAttrKafkaOffset:   attribute.Int64Value(42),
	}
	got := attrsOf(s)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("attribute %s = %v, want %v", k, got[k].Emit(), v.Emit())
		}
	}
	if len(got) != len(want) {
		t.Errorf("attributes %v, want exactly %v", got, want)
	}
	for _, v := range got {
		if e := v.Emit(); strings.Contains(e, "secret") {
			t.Errorf("span records %q", e)
		}
	}
	if s.Status().Code != codes.Unset {
		t.Errorf("status %v on success, want unset", s.Status())
	}
}

func TestTracingErrorStatusAndClass(t *testing.T) {
	t.Parallel()
	sr, tp := tracingSetup(t)
	boom := ackwise.Permanent(errors.New("malformed order"))
	h := middleware.Tracing(tp, middleware.TracingConfig{})(ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		return boom
	}))
	if err := h.Handle(t.Context(), &ackwise.Message{ID: "ev-2", Source: "orders", Partition: -1, Offset: -1, Attempt: 1}); err != boom {
		t.Fatalf("got %v, want the handler's error unchanged", err)
	}
	s := sr.Ended()[0]
	if s.Status().Code != codes.Error {
		t.Errorf("status %v, want Error", s.Status())
	}
	got := attrsOf(s)
	if got[middleware.SpanAttrErrorClass] != attribute.StringValue("permanent") {
		t.Errorf("%s = %v, want permanent", middleware.SpanAttrErrorClass, got[middleware.SpanAttrErrorClass].Emit())
	}
	if _, ok := got[middleware.SpanAttrPartition]; ok {
		t.Error("partition recorded for a message without one")
	}
	if ev := s.Events(); len(ev) != 1 || ev[0].Name != "exception" {
		t.Errorf("events %v, want one exception event", ev)
	}
}

func TestTracingNoParentWithoutHeader(t *testing.T) {
	t.Parallel()
	sr, tp := tracingSetup(t)
	h := middleware.Tracing(tp, middleware.TracingConfig{})(ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil }))
	for _, hdr := range []ackwise.Headers{nil, ackwise.HeadersOf(ackwise.HeaderTraceparent, "garbage")} {
		if err := h.Handle(t.Context(), &ackwise.Message{Source: "orders", Partition: -1, Headers: hdr}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range sr.Ended() {
		if s.Parent().IsValid() {
			t.Errorf("span has parent %v, want a root span", s.Parent())
		}
		if !s.SpanContext().IsValid() {
			t.Error("root span has no valid context")
		}
	}
	if n := len(sr.Ended()); n != 2 {
		t.Errorf("%d spans, want 2", n)
	}
	// A nil provider disables tracing: the handler still runs.
	if err := middleware.Tracing(nil, middleware.TracingConfig{})(ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })).Handle(t.Context(), &ackwise.Message{}); err != nil {
		t.Fatal(err)
	}
}

// TestTracingEndToEnd publishes inside a span with producer.InjectTrace,
// through the memory broker, to a consumer with Tracing in its middleware:
// the consumer span continues the producer's trace.
func TestTracingEndToEnd(t *testing.T) {
	t.Parallel()
	sr, tp := tracingSetup(t)
	br, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	src, err := br.QueueSource("orders")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pctx, pspan := tp.Tracer("test").Start(ctx, "send orders", trace.WithSpanKind(trace.SpanKindProducer))
	msg := &ackwise.Message{ID: "ev-9"}
	producer.InjectTrace(pctx, msg)
	if err := br.Publish(pctx, "orders", msg); err != nil {
		t.Fatal(err)
	}
	pspan.End()

	handled := make(chan trace.SpanContext, 1)
	c, err := consumer.New(src, ackwise.HandlerFunc(func(ctx context.Context, _ *ackwise.Message) error {
		handled <- trace.SpanContextFromContext(ctx)
		return nil
	}), consumer.Config{Middleware: []ackwise.Middleware{middleware.Tracing(tp, middleware.TracingConfig{})}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var got trace.SpanContext
	select {
	case got = <-handled:
	case <-time.After(30 * time.Second):
		t.Fatal("message not handled")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got.TraceID() != pspan.SpanContext().TraceID() {
		t.Fatalf("consumer trace %v, want the producer's %v", got.TraceID(), pspan.SpanContext().TraceID())
	}
	found := false
	for _, s := range sr.Ended() {
		if s.SpanContext().SpanID() == got.SpanID() {
			found = true
			if s.Parent().SpanID() != pspan.SpanContext().SpanID() {
				t.Errorf("consumer span parent %v, want the producer span %v", s.Parent().SpanID(), pspan.SpanContext().SpanID())
			}
		}
	}
	if !found {
		t.Error("consumer span not ended after Run returned")
	}
}

// BenchmarkTracing measures the middleware per call with the SDK (sampled,
// recorded) and with a no-op provider.
func BenchmarkTracing(b *testing.B) {
	msg := &ackwise.Message{ID: "ev-1", Source: "orders", Partition: 1, Offset: 7, Attempt: 1,
		Headers: ackwise.HeadersOf(ackwise.HeaderTraceparent, "00-"+parentTrace+"-"+parentSpan+"-01")}
	next := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })
	for _, bc := range []struct {
		name string
		tp   trace.TracerProvider
	}{
		{"sdk", sdktrace.NewTracerProvider()}, // sampled and recorded, not exported
		{"noop", noop.NewTracerProvider()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := middleware.Tracing(bc.tp, middleware.TracingConfig{})(next)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				_ = h.Handle(ctx, msg)
			}
		})
	}
}
