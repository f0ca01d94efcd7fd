package kafka

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// produceAt writes n records to topic with the record timestamp at: the
// producer's CreateTime, which the broker keeps.
func produceAt(t *testing.T, brokers []string, topic string, n int, at time.Time) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for i := range n {
		r := &kgo.Record{Topic: topic, Key: []byte{byte('a' + i)}, Value: []byte("x"), Timestamp: at,
			Headers: []kgo.RecordHeader{{Key: ackwise.HeaderEventID, Value: []byte{byte('a' + i)}}}}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// gaugeValues collects r's gauges by name (the last data point of each).
func gaugeValues(t *testing.T, r *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					got[m.Name] = dp.Value
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					got[m.Name] = float64(dp.Value)
				}
			case metricdata.Sum[int64]:
				if !d.IsMonotonic {
					for _, dp := range d.DataPoints {
						got[m.Name] = float64(dp.Value)
					}
				}
			}
		}
	}
	return got
}

// eventually collects until cond holds on the gauges, for up to 60s: the
// backlog poll runs on the real clock.
func eventually(t *testing.T, r *sdkmetric.ManualReader, what string, cond func(map[string]float64) bool) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := gaugeValues(t, r)
		if cond(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: gauges %v", what, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConsumerLagFromRecordTimestamp runs the engine on kfake over three
// records written with a timestamp an hour old, their handler blocked: the
// lag is the record timestamp's age (an hour, not the moments since the
// engine received them), the lag in messages the group's 3 uncommitted
// records (Source.Backlog); once the handler returns, both drain to 0.
func TestConsumerLagFromRecordTimestamp(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	produceAt(t, brokers, cfg.Topic, 3, time.Now().Add(-time.Hour))
	src := openSource(t, cfg)
	reader := sdkmetric.NewManualReader()
	obs, err := consumer.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), "billing", consumer.WithBacklog(src, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	started := make(chan struct{}, 3)
	h := ackwise.HandlerFunc(func(ctx context.Context, _ *ackwise.Message) error {
		started <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	c, err := consumer.New(src, h, consumer.Config{Name: "billing", Observer: obs, Ordering: consumer.OrderNone})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	defer func() {
		cancel()
		wg.Wait()
	}()
	select {
	case <-started:
	case <-time.After(60 * time.Second):
		t.Fatal("no record reached the handler")
	}
	got := eventually(t, reader, "backlog of 3 polled", func(g map[string]float64) bool { return g[consumer.MetricLagMessages] == 3 })
	// An hour, give or take the test's own run time: the engine received
	// the records seconds ago.
	if lag := got[consumer.MetricLagAge]; lag < 3600 || lag > 3600+120 {
		t.Errorf("lag = %vs, want the record timestamp's age (3600s)", lag)
	}
	if got[consumer.MetricInFlight] < 1 {
		t.Errorf("in flight = %v, want at least 1", got[consumer.MetricInFlight])
	}
	close(release)
	got = eventually(t, reader, "drained", func(g map[string]float64) bool {
		return g[consumer.MetricLagMessages] == 0 && g[consumer.MetricInFlight] == 0
	})
	if got[consumer.MetricLagAge] != 0 || got[consumer.MetricDrainTime] != 0 {
		t.Errorf("after the drain: lag %vs, drain time %vs; want 0 and 0", got[consumer.MetricLagAge], got[consumer.MetricDrainTime])
	}
}

// TestDLQDepthFromBacklog: dlq.NewDepthMetrics on a Kafka source of a
// dead-letter topic reports the records its group has not committed.
func TestDLQDepthFromBacklog(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 2)
	produceAt(t, brokers, cfg.Topic, 5, time.Now())
	src := openSource(t, cfg)
	reader := sdkmetric.NewManualReader()
	d, err := dlq.NewDepthMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), src, dlq.DepthMetricsConfig{Destination: cfg.Topic})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got := gaugeValues(t, reader); got[dlq.MetricDepth] != 5 {
		t.Fatalf("depth %v (err %v), want 5", got, d.Err())
	}
}
