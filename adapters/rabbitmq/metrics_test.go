package rabbitmq

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
)

// TestConsumerLagFromTimestampProperty runs the engine on a real queue
// with its handler blocked: a message published with the AMQP timestamp
// property an hour ago reads a lag of an hour (the broker timestamp, not
// the receive); one published without it counts from its receive.
func TestConsumerLagFromTimestampProperty(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		stamp    time.Time
		min, max float64
	}{
		{"timestamp", time.Now().Add(-time.Hour), 3599, 3600 + 120},
		{"no timestamp", time.Time{}, 0, 120},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conn := needBroker(t)
			cfg := testConfig(t, Classic)
			declare(t, cfg)
			rawPublish(t, conn, cfg.Queue, amqp.Publishing{MessageId: "m1", Timestamp: tc.stamp, Body: []byte("x")})
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			src, err := NewSource(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			reader := sdkmetric.NewManualReader()
			obs, err := consumer.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), "billing")
			if err != nil {
				t.Fatal(err)
			}
			release, started := make(chan struct{}), make(chan struct{}, 1)
			h := ackwise.HandlerFunc(func(ctx context.Context, _ *ackwise.Message) error {
				started <- struct{}{}
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			})
			c, err := consumer.New(src, h, consumer.Config{Name: "billing", Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
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
			case <-ctx.Done():
				t.Fatal("the message did not reach the handler")
			}
			var rm metricdata.ResourceMetrics
			if err := reader.Collect(ctx, &rm); err != nil {
				t.Fatal(err)
			}
			lag, found := -1.0, false
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					if m.Name != consumer.MetricLagAge {
						continue
					}
					for _, dp := range m.Data.(metricdata.Gauge[float64]).DataPoints {
						if v, _ := dp.Attributes.Value(consumer.AttrSource); v.AsString() == cfg.Queue {
							lag, found = dp.Value, true
						}
					}
				}
			}
			if !found || lag < tc.min || lag > tc.max {
				t.Errorf("lag of %s = %vs (found %v), want %v to %vs", cfg.Queue, lag, found, tc.min, tc.max)
			}
			close(release)
		})
	}
}
