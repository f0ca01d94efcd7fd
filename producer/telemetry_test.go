package producer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/retry"
)

// TestPublisherTelemetry publishes three messages through a sink that
// confirms one, fails one for good (permanent) and one until the attempts
// run out (transient), then one message that goes through. The counters
// match, by error.type; the duration has one call per outcome; each call is
// a producer span named after the destination, and the traceparent of a
// message is its call's span.
func TestPublisherTelemetry(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	gone := ackwise.Permanent(errors.New("message too large"))
	busy := errors.New("broker busy")
	sink := &scriptedSink{script: []map[string]error{
		{"bad": gone, "slow": busy},
		{"slow": busy},
	}}
	p, err := producer.New(sink, producer.Config{
		Retry:          retry.Policy{MaxAttempts: 2, InitialInterval: time.Millisecond},
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		TracerProvider: tp,
		Destination:    "orders",
		System:         "rabbitmq",
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, parent := tp.Tracer("test").Start(t.Context(), "checkout")
	batch := []*ackwise.Message{{ID: "ok"}, {ID: "bad"}, {ID: "slow"}}
	if err := p.Publish(ctx, batch...); err == nil {
		t.Fatal("Publish succeeded; want the two failures")
	}
	single := &ackwise.Message{ID: "later"}
	if err := p.Publish(ctx, single); err != nil {
		t.Fatal(err)
	}
	parent.End()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	dest := []attribute.KeyValue{attribute.String(producer.AttrDestination, "orders"), attribute.String(producer.AttrSystem, "rabbitmq")}
	set := func(class string) attribute.Set {
		if class == "" {
			return attribute.NewSet(dest...)
		}
		return attribute.NewSet(append([]attribute.KeyValue{attribute.String(producer.AttrErrorType, class)}, dest...)...)
	}
	counts := map[string]map[attribute.Set]int64{}
	calls := map[attribute.Set]uint64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != producer.InstrumentationName || sm.Scope.Version == "" {
			t.Errorf("scope %q version %q", sm.Scope.Name, sm.Scope.Version)
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				counts[m.Name] = map[attribute.Set]int64{}
				for _, dp := range d.DataPoints {
					counts[m.Name][dp.Attributes] += dp.Value
				}
			case metricdata.Histogram[float64]:
				if m.Name != producer.MetricPublishDuration || m.Unit != "s" {
					t.Errorf("histogram %q unit %q", m.Name, m.Unit)
				}
				for _, dp := range d.DataPoints {
					calls[dp.Attributes] += dp.Count
					if dp.Sum <= 0 {
						t.Errorf("duration sum %v", dp.Sum)
					}
				}
			}
		}
	}
	if got := counts[producer.MetricPublished][set("")]; got != 2 {
		t.Errorf("published = %d, want 2 (ok, later)", got)
	}
	if got := counts[producer.MetricFailed][set("permanent")]; got != 1 {
		t.Errorf("failed{permanent} = %d, want 1", got)
	}
	if got := counts[producer.MetricFailed][set("transient")]; got != 1 {
		t.Errorf("failed{transient} = %d, want 1", got)
	}
	if len(counts[producer.MetricFailed]) != 2 {
		t.Errorf("failed series %v, want permanent and transient", counts[producer.MetricFailed])
	}
	// The failed call is classed by its first failed message's error.
	if calls[set("")] != 1 || calls[set("permanent")] != 1 || len(calls) != 2 {
		t.Errorf("publish calls %v, want one ok and one permanent", calls)
	}

	var spans []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == "publish orders" {
			spans = append(spans, s)
		}
	}
	if len(spans) != 2 {
		t.Fatalf("%d publish spans, want 2", len(spans))
	}
	failed, ok := spans[0], spans[1]
	for _, s := range spans {
		if s.SpanKind() != trace.SpanKindProducer || s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("span %q kind %v parent %v, want producer under checkout", s.Name(), s.SpanKind(), s.Parent().SpanID())
		}
		attrs := attribute.NewSet(s.Attributes()...)
		for k, v := range map[string]string{producer.AttrOperationType: "send", producer.AttrOperationName: "publish", producer.AttrDestination: "orders", producer.AttrSystem: "rabbitmq"} {
			if got, _ := attrs.Value(attribute.Key(k)); got.AsString() != v {
				t.Errorf("span attribute %s = %q, want %q", k, got.AsString(), v)
			}
		}
	}
	failedAttrs, okAttrs := attribute.NewSet(failed.Attributes()...), attribute.NewSet(ok.Attributes()...)
	if n, _ := failedAttrs.Value(producer.AttrBatchCount); n.AsInt64() != 3 {
		t.Errorf("batch span message count %v, want 3", n)
	}
	if failed.Status().Code.String() != "Error" {
		t.Errorf("failed call's span status %v, want Error", failed.Status())
	}
	if c, _ := failedAttrs.Value(producer.AttrErrorType); c.AsString() != "permanent" {
		t.Errorf("failed span error.type %q, want permanent", c.AsString())
	}
	if id, _ := okAttrs.Value(producer.AttrMessageID); id.AsString() != "later" {
		t.Errorf("single span message id %q, want later", id.AsString())
	}
	want := "00-" + ok.SpanContext().TraceID().String() + "-" + ok.SpanContext().SpanID().String() + "-01"
	if got := single.Headers.Get(ackwise.HeaderTraceparent); got != want {
		t.Errorf("traceparent %q, want the publish span %q", got, want)
	}
}

// Without providers a Publisher records nothing and writes the caller's
// trace context, as before.
func TestPublisherWithoutTelemetryInjectsCallerSpan(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	p, err := producer.New(&scriptedSink{}, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, span := tp.Tracer("test").Start(t.Context(), "checkout")
	defer span.End()
	msg := &ackwise.Message{ID: "e"}
	if err := p.Publish(ctx, msg); err != nil {
		t.Fatal(err)
	}
	sc := span.SpanContext()
	if got := msg.Headers.Get(ackwise.HeaderTraceparent); got != "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01" {
		t.Errorf("traceparent %q, want the caller's span", got)
	}
}
