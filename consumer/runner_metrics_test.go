package consumer_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/ackwise/ackwise/consumer"
)

// TestRunnerServesMetrics: with RunnerConfig.Metrics set to the
// OpenTelemetry Prometheus exporter's handler, the Runner's Handler serves
// the consumers' instruments at /metrics, under a prefix too, while the
// probes answer as before.
func TestRunnerServesMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := consumer.NewMetrics(mp, "orders")
	if err != nil {
		t.Fatal(err)
	}
	tb := setupRunner(t, consumer.Config{Observer: obs}, "orders")
	close(tb.release)
	r, err := consumer.NewRunner(consumer.RunnerConfig{IgnoreSignals: true, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}, tb.consumers...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	tb.awaitHandlers(t)
	// The engine counts the ack in Stats before it tells the Observer:
	// wait for the scrape to show it.
	want := `ackwise_consumer_messages_total{ackwise_consumer_name="orders",ackwise_outcome="acked",messaging_destination_name="orders"`
	h := http.StripPrefix("/ops", r.Handler())
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		code, body := probe(t, h, "/ops/metrics")
		if code == http.StatusOK && strings.Contains(body, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics = %d, want a line starting %s in:\n%s", code, want, body)
		}
	}
	if code, body := probe(t, r.Handler(), "/readyz"); code != http.StatusOK || !strings.HasPrefix(body, "running\n") {
		t.Fatalf("/readyz beside /metrics = %d %q", code, body)
	}
	cancel()
	if err := awaitRun(t, done); err != nil {
		t.Fatal(err)
	}
}
