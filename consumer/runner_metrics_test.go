package consumer_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
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
	if !waitStats(tb.consumers[0], 10*time.Second, func(s consumer.Stats) bool { return s.Acked == 1 }) {
		t.Fatalf("message not acked: %+v", tb.consumers[0].Stats())
	}
	srv := httptest.NewServer(http.StripPrefix("/ops", r.Handler()))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/ops/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	body := string(raw)
	want := `ackwise_consumer_messages_total{ackwise_consumer_name="orders",ackwise_outcome="acked",messaging_destination_name="orders"`
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, want) {
		t.Fatalf("/metrics = %d, want a line starting %s in:\n%s", resp.StatusCode, want, body)
	}
	if code, body := probe(t, r.Handler(), "/readyz"); code != http.StatusOK || !strings.HasPrefix(body, "running\n") {
		t.Fatalf("/readyz beside /metrics = %d %q", code, body)
	}
	cancel()
	if err := awaitRun(t, done); err != nil {
		t.Fatal(err)
	}
}
