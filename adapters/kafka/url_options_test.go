package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/internal/urlparam"
	"github.com/ackwise/ackwise/internal/logbuf"
)

// urlSource opens a source by URL on cfg's topic and group, with opts, and
// hands it one record published before it opens.
func urlSource(t *testing.T, cfg SourceConfig, query string, opts ...adapters.OpenOption) *Source {
	t.Helper()
	publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw := "kafka://" + strings.Join(cfg.Brokers, ",") + "/" + cfg.Topic + "?group=" + cfg.Group + query
	src, err := adapters.OpenSource(ctx, raw, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	receiveN(t, src, 1)
	return src.(*Source)
}

// TestURLSourceTakesLogger: a source opened by URL with adapters.WithLogger
// logs through it, franz-go's records included (through the slog bridge).
func TestURLSourceTakesLogger(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, newCluster(t), 1)
	var logs logbuf.Buffer
	urlSource(t, cfg, "", adapters.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	if !strings.Contains(logs.String(), `msg="kgo: `) {
		t.Fatalf("no franz-go record in the logger given:\n%s", logs.String())
	}
}

// TestURLSourceTakesTelemetry: franz-go's client metrics reach the meter
// provider given by adapters.WithMeterProvider, and its spans the tracer
// provider given by adapters.WithTracerProvider.
func TestURLSourceTakesTelemetry(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, newCluster(t), 1)
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	urlSource(t, cfg, "",
		adapters.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
		adapters.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))))
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			seen = append(seen, m.Name)
		}
	}
	if !slices.Contains(seen, "messaging.kafka.fetch_records.count") {
		t.Errorf("metrics %v, want messaging.kafka.fetch_records.count", seen)
	}
	want := cfg.Topic + " receive"
	if !slices.ContainsFunc(spans.Ended(), func(s sdktrace.ReadOnlySpan) bool { return s.Name() == want }) {
		t.Errorf("%d spans, none named %q", len(spans.Ended()), want)
	}
}

// TestURLSourceTakesTLSConfig: adapters.WithTLSConfig dials the brokers
// with that config: a broker serving TLS with a certificate only that
// config trusts is reached, and without it is not. With a tls parameter in
// the URL too, the error names both.
func TestURLSourceTakesTLSConfig(t *testing.T) {
	t.Parallel()
	srvTLS, caFile := selfSigned(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(srvTLS))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	clientTLS := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	cfg := SourceConfig{ClientConfig: ClientConfig{Brokers: c.ListenAddrs(), TLS: clientTLS}, Topic: uniq("t"), Group: "g"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := CreateTopics(ctx, cfg, 1, 1); err != nil {
		t.Fatal(err)
	}
	src := urlSource(t, cfg, "", adapters.WithTLSConfig(clientTLS))
	if got, _ := src.Client().OptValue(kgo.DialTLSConfig).(*tls.Config); got != clientTLS {
		t.Fatalf("client's TLS config %p, want the one given %p", got, clientTLS)
	}
	raw := "kafka://" + c.ListenAddrs()[0] + "/" + cfg.Topic + "?group=g2"
	bctx, bcancel := context.WithTimeout(ctx, 3*time.Second)
	defer bcancel()
	if src, err := adapters.OpenSource(bctx, raw, adapters.WithTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12})); err == nil {
		_ = src.Close()
		t.Fatal("opened with a TLS config that does not trust the broker")
	}
	for _, q := range []string{"&tls=true", "&tls=false", "&tls_server_name=localhost"} {
		_, err := adapters.OpenSource(ctx, raw+q, adapters.WithTLSConfig(clientTLS))
		name, _, _ := strings.Cut(strings.TrimPrefix(q, "&"), "=")
		if err == nil || !strings.Contains(err.Error(), `URL parameter "`+name+`" is given with adapters.WithTLSConfig`) {
			t.Errorf("%s with WithTLSConfig: %v, want an error naming both", q, err)
		}
	}
}

// TestURLSourceTakesClientOptions: kafka.WithClientOptions passes franz-go
// options to a source opened by URL; one that turns auto-commit on is
// refused, and so is another adapter's option.
func TestURLSourceTakesClientOptions(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, newCluster(t), 1)
	src := urlSource(t, cfg, "&session_timeout=7s&rebalance_timeout=20s&heartbeat_interval=700ms",
		WithClientOptions(kgo.FetchMaxWait(1500*time.Millisecond)))
	cl := src.Client()
	for opt, want := range map[string]time.Duration{"FetchMaxWait": 1500 * time.Millisecond, "SessionTimeout": 7 * time.Second,
		"RebalanceTimeout": 20 * time.Second, "HeartbeatInterval": 700 * time.Millisecond} {
		o := map[string]any{"FetchMaxWait": kgo.FetchMaxWait, "SessionTimeout": kgo.SessionTimeout,
			"RebalanceTimeout": kgo.RebalanceTimeout, "HeartbeatInterval": kgo.HeartbeatInterval}[opt]
		if got, _ := cl.OptValue(o).(time.Duration); got != want {
			t.Errorf("client %s = %v, want %v", opt, got, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	raw := "kafka://" + cfg.Brokers[0] + "/" + cfg.Topic + "?group=other"
	_, err := adapters.OpenSource(ctx, raw, WithClientOptions(kgo.AutoCommitMarks()))
	if err == nil || !strings.Contains(err.Error(), "kafka.WithClientOptions turn auto-commit on (kgo.AutoCommitMarks)") {
		t.Errorf("WithClientOptions(kgo.AutoCommitMarks()): %v, want it refused", err)
	}
	_, err = adapters.OpenSink(ctx, "kafka://"+cfg.Brokers[0]+"/"+cfg.Topic, WithClientOptions(kgo.DisableIdempotentWrite()))
	if err == nil || !strings.Contains(err.Error(), "kafka.WithClientOptions disable idempotent writes") {
		t.Errorf("sink with WithClientOptions(kgo.DisableIdempotentWrite()): %v, want it refused", err)
	}
	type otherKey struct{}
	_, err = adapters.OpenSource(ctx, raw, adapters.WithAdapterOption(otherKey{}, 1))
	if !errors.Is(err, adapters.ErrUnsupportedOption) {
		t.Errorf("another adapter's option: %v, want ErrUnsupportedOption", err)
	}
}

// TestURLErrorsNameParameters: an error in a kafka URL names the URL
// parameter (or the part of the URL) at fault, never a Go field. Before, a
// URL without group= failed with "Config.Group is empty".
func TestURLErrorsNameParameters(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := adapters.OpenSource(ctx, "kafka://127.0.0.1:1/orders"); err == nil || !strings.Contains(err.Error(), "URL has no group= parameter") {
		t.Errorf("source URL without group: %v", err)
	}
	for query, want := range map[string]string{
		"tiers=1m,1m":                       `URL parameter "tiers" has 1m twice`,
		"tiers=0s":                          `URL parameter "tiers" = "0s"`,
		"dlq=orders":                        `URL parameter "dlq" = "orders": must differ from URL topic (the path) "orders"`,
		"dlq=or*ders":                       `URL parameter "dlq" = "or*ders": Kafka topic names`,
		"tiers=1m&retry_prefix=a*":          `URL parameter "retry_prefix" for tier 1m = "a*1m"`,
		"tiers=1m&retry_prefix=x.&dlq=x.1m": `URL parameter "retry_prefix" for tier 1m = "x.1m": collides`,
		"revoke_timeout=30s&rebalance_timeout=20s": `URL parameter "revoke_timeout" = 30s: must be below URL parameter "rebalance_timeout" = 20s`,
		"session_timeout=soon":                     `URL parameter "session_timeout" = "soon"`,
		"heartbeat_interval=-1s":                   `URL parameter "heartbeat_interval" = "-1s"`,
		"start=now":                                `URL parameter "start" = "now"`,
	} {
		u, err := url.Parse("kafka://h:9092/orders?group=g&" + query)
		if err != nil {
			t.Fatal(err)
		}
		_, err = ParseURL(u)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "Config.") || !errors.Is(err, urlparam.ErrParam) {
			t.Errorf("%s: %v, want an error containing %q and no Go field, matching urlparam.ErrParam", query, err, want)
		}
	}
	for raw, want := range map[string]string{
		"kafka://h:9092/or*ders":    `URL topic (the path) = "or*ders"`,
		"kafka://h:9092/":           "no topic in the path",
		"kafka://h:9092,,h2:9092/t": `URL brokers[1] = ""`,
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseSinkURL(u); err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, urlparam.ErrParam) {
			t.Errorf("sink URL %s: %v, want an error containing %q, matching urlparam.ErrParam", raw, err, want)
		}
	}
}

// TestDocsListURLParameters: docs/kafka.md lists the URL parameters as the
// parser's table has them.
func TestDocsListURLParameters(t *testing.T) {
	if err := urlParams.DocumentedIn("../../docs/kafka.md"); err != nil {
		t.Fatal(err)
	}
}
