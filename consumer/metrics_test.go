package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// countingObserver forwards to next and signals done after want outcomes:
// the test's signal that the consumer has settled everything.
type countingObserver struct {
	next consumer.Observer
	n    atomic.Int64
	want int64
	done chan struct{}
}

func (o *countingObserver) Observe(msg *ackwise.Message, out consumer.Outcome, d time.Duration) {
	o.next.Observe(msg, out, d)
	if o.n.Add(1) == o.want {
		close(o.done)
	}
}

// TestMetricsMatchConsumerRun runs a consumer on the memory broker — 10
// messages acked (one of them after a transient failure), 2 dead-lettered —
// and checks that the exported metrics match what the consumer and the
// broker say happened, with retries at the broker and in place.
func TestMetricsMatchConsumerRun(t *testing.T) {
	t.Parallel()
	for _, mode := range []consumer.RetryMode{consumer.RetryBroker, consumer.RetryInPlace} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			testMetricsRun(t, mode)
		})
	}
}

func testMetricsRun(t *testing.T, mode consumer.RetryMode) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	obs, err := consumer.NewMetrics(mp, "billing")
	if err != nil {
		t.Fatal(err)
	}
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
	for i := range 12 {
		m := &ackwise.Message{ID: fmt.Sprintf("e%d", i), Payload: []byte("ok")}
		switch i {
		case 3, 7:
			m.Payload = []byte("bad")
		case 5:
			m.Payload = []byte("flaky")
		}
		if err := br.Publish(ctx, "orders", m); err != nil {
			t.Fatal(err)
		}
	}
	h := ackwise.HandlerFunc(func(_ context.Context, msg *ackwise.Message) error {
		switch string(msg.Payload) {
		case "bad":
			return ackwise.Permanent(errors.New("malformed"))
		case "flaky":
			if msg.Attempt == 1 {
				return errors.New("db timeout")
			}
		}
		return nil
	})
	// 10 acked + 2 dead-lettered + 1 retried.
	co := &countingObserver{next: obs, want: 13, done: make(chan struct{})}
	c, err := consumer.New(src, h, consumer.Config{
		Name:      "billing",
		Observer:  co,
		RetryMode: mode,
		Retry:     retry.Policy{InitialInterval: time.Millisecond, Jitter: retry.NoJitter},
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-co.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("consumer did not settle 13 outcomes; stats %+v", c.Stats())
	}
	cancel()
	wg.Wait()

	st := c.Stats()
	if st.Acked != 10 || st.DeadLettered != 2 || st.Retried != 1 {
		t.Fatalf("consumer stats %+v, want 10 acked, 2 dead-lettered, 1 retried", st)
	}
	dead, err := br.Messages("orders" + memory.DeadLetterSuffix)
	if err != nil || len(dead) != 2 {
		t.Fatalf("dead-letter queue holds %d messages (%v), want 2", len(dead), err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	base := []attribute.KeyValue{attribute.String(consumer.AttrSource, "orders"), attribute.String(consumer.AttrConsumer, "billing")}
	withOutcome := func(o string) attribute.Set {
		return attribute.NewSet(append([]attribute.KeyValue{attribute.String(consumer.AttrOutcome, o)}, base...)...)
	}
	counts := map[attribute.Set]int64{}
	durations := map[attribute.Set]uint64{}
	var redeliveries int64
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != consumer.MeterName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, consumer.MeterName)
		}
		for _, m := range sm.Metrics {
			switch m.Name {
			case consumer.MetricMessages:
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					counts[dp.Attributes] += dp.Value
				}
			case consumer.MetricHandlerDuration:
				if m.Unit != "s" {
					t.Errorf("duration unit %q, want s", m.Unit)
				}
				for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
					durations[dp.Attributes] += dp.Count
					if dp.Sum <= 0 {
						t.Errorf("duration sum %v for %v, want > 0", dp.Sum, dp.Attributes.Encoded(attribute.DefaultEncoder()))
					}
				}
			case consumer.MetricRedeliveries:
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					if !dp.Attributes.Equals(ptr(attribute.NewSet(base...))) {
						t.Errorf("redeliveries attributes %v", dp.Attributes.Encoded(attribute.DefaultEncoder()))
					}
					redeliveries += dp.Value
				}
			default:
				t.Errorf("unexpected metric %q", m.Name)
			}
		}
	}
	want := map[string]uint64{"acked": st.Acked, "dead-lettered": st.DeadLettered, "retried": st.Retried}
	if len(counts) != len(want) {
		t.Errorf("got %d outcome series, want %d: %v", len(counts), len(want), counts)
	}
	for o, n := range want {
		if got := counts[withOutcome(o)]; got != int64(n) {
			t.Errorf("%s{outcome=%s} = %d, want %d", consumer.MetricMessages, o, got, n)
		}
		if got := durations[withOutcome(o)]; got != n {
			t.Errorf("%s{outcome=%s} count = %d, want %d", consumer.MetricHandlerDuration, o, got, n)
		}
	}
	if redeliveries != 1 {
		t.Errorf("%s = %d, want 1 (the flaky message's second attempt)", consumer.MetricRedeliveries, redeliveries)
	}
}

func ptr[T any](v T) *T { return &v }

// TestMetricsNilProvider checks that a nil provider is a working no-op.
func TestMetricsNilProvider(t *testing.T) {
	t.Parallel()
	obs, err := consumer.NewMetrics(nil, "")
	if err != nil || obs == nil {
		t.Fatalf("NewMetrics(nil) = %v, %v", obs, err)
	}
	obs.Observe(&ackwise.Message{Source: "q", Attempt: 2}, consumer.Released, 0)
	obs.Observe(nil, consumer.Outcome(99), time.Second) // neither panics
}

// BenchmarkMetricsObserve measures Observe on the SDK with a manual reader,
// after the source's attribute sets are cached.
func BenchmarkMetricsObserve(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	obs, err := consumer.NewMetrics(mp, "billing")
	if err != nil {
		b.Fatal(err)
	}
	msg := &ackwise.Message{Source: "orders", Attempt: 2}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			obs.Observe(msg, consumer.Acked, 3*time.Millisecond)
		}
	})
}

// A move that failed twice before the dead letter was written: the engine
// observes settle-failed with the handler's run time, then settle-failed
// and dead-lettered without a run (elapsed 0). The run is recorded once in
// the duration histogram, the redelivery once; every outcome is counted.
func TestMetricsMoveTriedAgainCountsOneRun(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	obs, err := consumer.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), "billing")
	if err != nil {
		t.Fatal(err)
	}
	m := &ackwise.Message{ID: "e", Source: "orders", Attempt: 2}
	obs.Observe(m, consumer.SettleFailed, 3*time.Millisecond)
	obs.Observe(m, consumer.SettleFailed, 0)
	obs.Observe(m, consumer.DeadLettered, 0)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	var messages, redeliveries int64
	var runs uint64
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch mt.Name {
			case consumer.MetricMessages:
				for _, dp := range mt.Data.(metricdata.Sum[int64]).DataPoints {
					messages += dp.Value
				}
			case consumer.MetricHandlerDuration:
				for _, dp := range mt.Data.(metricdata.Histogram[float64]).DataPoints {
					runs += dp.Count
				}
			case consumer.MetricRedeliveries:
				for _, dp := range mt.Data.(metricdata.Sum[int64]).DataPoints {
					redeliveries += dp.Value
				}
			}
		}
	}
	if messages != 3 || runs != 1 || redeliveries != 1 {
		t.Fatalf("messages %d, handler runs %d, redeliveries %d: want 3, 1, 1", messages, runs, redeliveries)
	}
}
