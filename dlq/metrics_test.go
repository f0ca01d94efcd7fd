package dlq_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/dlq"
)

// countBacklog answers Backlog with n (or err), counting the calls.
type countBacklog struct {
	n     atomic.Int64
	err   atomic.Pointer[error]
	calls atomic.Int32
}

func (b *countBacklog) Backlog(context.Context) (int, error) {
	b.calls.Add(1)
	if e := b.err.Load(); e != nil {
		return 0, *e
	}
	return int(b.n.Load()), nil
}

// gauges collects and returns the depth and age gauges' values (absent:
// not in the map), checking their destination attribute.
func gauges(t *testing.T, r *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != dlq.MeterName || sm.Scope.Version == "" {
			t.Errorf("scope %q version %q", sm.Scope.Name, sm.Scope.Version)
		}
		for _, m := range sm.Metrics {
			var dest string
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				got[m.Name] = float64(d.DataPoints[0].Value)
				v, _ := d.DataPoints[0].Attributes.Value(dlq.AttrDestination)
				dest = v.AsString()
			case metricdata.Gauge[float64]:
				got[m.Name] = d.DataPoints[0].Value
				v, _ := d.DataPoints[0].Attributes.Value(dlq.AttrDestination)
				dest = v.AsString()
			}
			if dest != "orders.dlq" {
				t.Errorf("%s destination %q, want orders.dlq", m.Name, dest)
			}
		}
	}
	return got
}

// TestDepthMetrics: the depth is the Backlogger's answer, asked at most
// once per interval however often collections come; the oldest age grows
// with the clock; a failed call leaves the gauge out and says why in Err.
func TestDepthMetrics(t *testing.T) {
	t.Parallel()
	clk := memory.NewVirtualClock(time.Time{})
	src := &countBacklog{}
	src.n.Store(204)
	deadAt := clk.Now().Add(-time.Hour)
	var empty atomic.Bool
	oldest := dlq.AgerFunc(func(context.Context) (time.Time, bool, error) { return deadAt, !empty.Load(), nil })
	reader := sdkmetric.NewManualReader()
	d, err := dlq.NewDepthMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), src, dlq.DepthMetricsConfig{
		Destination: "orders.dlq", Interval: time.Minute, Oldest: oldest, Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	got := gauges(t, reader)
	if got[dlq.MetricDepth] != 204 || got[dlq.MetricOldestAge] != 3600 {
		t.Errorf("depth %v age %v, want 204 and 3600s", got[dlq.MetricDepth], got[dlq.MetricOldestAge])
	}
	src.n.Store(300)
	clk.Advance(30 * time.Second)
	got = gauges(t, reader)
	if src.calls.Load() != 1 || got[dlq.MetricDepth] != 204 || got[dlq.MetricOldestAge] != 3630 {
		t.Errorf("within the interval: %d calls, depth %v, age %v; want 1 call, the cached 204, age 3630s", src.calls.Load(), got[dlq.MetricDepth], got[dlq.MetricOldestAge])
	}
	clk.Advance(30 * time.Second)
	got = gauges(t, reader)
	if src.calls.Load() != 2 || got[dlq.MetricDepth] != 300 {
		t.Errorf("after the interval: %d calls, depth %v; want 2 calls, 300", src.calls.Load(), got[dlq.MetricDepth])
	}
	down := errors.New("queue does not exist")
	src.err.Store(&down)
	empty.Store(true)
	clk.Advance(time.Minute)
	got = gauges(t, reader)
	if _, ok := got[dlq.MetricDepth]; ok || !errors.Is(d.Err(), down) {
		t.Errorf("after a failed call: depth %v (want none), Err %v", got, d.Err())
	}
	if got[dlq.MetricOldestAge] != 0 {
		t.Errorf("empty destination: oldest age %v, want 0", got[dlq.MetricOldestAge])
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if got := gauges(t, reader); len(got) != 0 {
		t.Errorf("after Close: %v", got)
	}
}

func TestDepthMetricsConfig(t *testing.T) {
	t.Parallel()
	if _, err := dlq.NewDepthMetrics(nil, nil, dlq.DepthMetricsConfig{}); err == nil || !strings.Contains(err.Error(), "Backlogger is nil") {
		t.Errorf("nil source: %v", err)
	}
	if _, err := dlq.NewDepthMetrics(nil, &countBacklog{}, dlq.DepthMetricsConfig{Interval: time.Millisecond}); err == nil || !strings.Contains(err.Error(), "Interval = 1ms") {
		t.Errorf("short interval: %v", err)
	}
	d, err := dlq.NewDepthMetrics(nil, &countBacklog{}, dlq.DepthMetricsConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}
