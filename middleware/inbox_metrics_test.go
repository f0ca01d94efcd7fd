package middleware_test

import (
	"context"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/meminbox"
)

// TestInboxDuplicatesCounted delivers one event three times from two
// sources: the handler runs once, and the two duplicates are counted by
// source, with the consumer's name.
func TestInboxDuplicatesCounted(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mw, err := middleware.Inbox(meminbox.New(nil), middleware.InboxConfig{
		Consumer:      "billing",
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
	})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := mw(counting(&runs))
	for _, src := range []string{"orders", "orders", "orders.retry"} {
		if err := h.Handle(t.Context(), &ackwise.Message{ID: "e1", Source: src}); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
	got := duplicatesBySource(t, reader)
	if got["orders"] != 1 || got["orders.retry"] != 1 || len(got) != 2 {
		t.Fatalf("duplicates by source %v, want orders 1, orders.retry 1", got)
	}
}

// duplicatesBySource collects MetricInboxDuplicates from reader, checking
// its scope, unit, kind and consumer attribute, summed by source.
func duplicatesBySource(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != middleware.MeterName || sm.Scope.Version == "" {
			t.Errorf("scope %q version %q", sm.Scope.Name, sm.Scope.Version)
		}
		for _, m := range sm.Metrics {
			if m.Name != middleware.MetricInboxDuplicates || m.Unit != "{message}" {
				t.Errorf("metric %q unit %q", m.Name, m.Unit)
				continue
			}
			sum := m.Data.(metricdata.Sum[int64])
			if !sum.IsMonotonic {
				t.Error("duplicates is not a counter")
			}
			for _, dp := range sum.DataPoints {
				if c, _ := dp.Attributes.Value(middleware.AttrConsumer); c.AsString() != "billing" {
					t.Errorf("consumer attribute %v", dp.Attributes.Encoded(attribute.DefaultEncoder()))
				}
				src, _ := dp.Attributes.Value(middleware.AttrDestination)
				got[src.AsString()] += dp.Value
			}
		}
	}
	return got
}

// TestBatchInboxDuplicatesCounted: BatchInbox counts each duplicate
// message once, a copy within the batch and an event handled before alike.
func TestBatchInboxDuplicatesCounted(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mw, err := middleware.BatchInbox(meminbox.New(nil), middleware.InboxConfig{
		Consumer:      "billing",
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(ackwise.BatchHandlerFunc(func(context.Context, []*ackwise.Message) error { return nil }))
	for _, msgs := range [][]*ackwise.Message{batchOf("e1", "e2", "e1"), batchOf("e2", "e3")} {
		for _, m := range msgs {
			m.Source = "orders"
		}
		if err := h.HandleBatch(t.Context(), msgs); err != nil {
			t.Fatal(err)
		}
	}
	if got := duplicatesBySource(t, reader); got["orders"] != 2 || len(got) != 1 {
		t.Fatalf("duplicates by source %v, want orders 2 (e1's copy, then e2)", got)
	}
}
