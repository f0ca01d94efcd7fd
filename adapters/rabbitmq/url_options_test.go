package rabbitmq

import (
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/internal/urlparam"
)

// waitLog waits for a log record whose message contains want.
func waitLog(t *testing.T, logs <-chan slog.Record, want string) slog.Record {
	t.Helper()
	timeout := time.After(testTimeout)
	for {
		select {
		case r := <-logs:
			if strings.Contains(r.Message, want) {
				return r
			}
		case <-timeout:
			t.Fatalf("no log record %q", want)
		}
	}
}

// TestOpenByURLWithOptions: a source opened by an amqps:// URL dials TLS
// with the config of adapters.WithTLSConfig (and cannot connect without
// it), logs its reconnection through the logger given after its
// connection is killed, counts a consumer-timeout warning with the meter
// provider given and traces its Nack's move with the tracer provider
// given; a sink opened by URL traces its Publish. A sink refuses a meter
// provider, and both refuse a TLS config with an amqp:// URL or beside the
// URL's TLS parameters, and another adapter's option.
func TestOpenByURLWithOptions(t *testing.T) {
	t.Parallel()
	needBroker(t)
	cfg := testConfig(t, Classic, 100*time.Millisecond)
	uri, err := amqp.ParseURI(testURL())
	if err != nil {
		t.Fatal(err)
	}
	proxyURL, tc := tlsProxy(t)
	pu, err := url.Parse(proxyURL)
	if err != nil {
		t.Fatal(err)
	}
	addr := pu.Host
	q := url.Values{"declare": {"true"}, "tiers": {"100ms"}, "connection_name": {cfg.ConnectionName}, "vhost": {uri.Vhost}}
	rawURL := func(scheme string, q url.Values) string {
		return (&url.URL{Scheme: scheme, User: url.UserPassword(uri.Username, uri.Password), Host: addr, Path: "/" + cfg.Queue, RawQuery: q.Encode()}).String()
	}
	logs := make(chan slog.Record, 256)
	var warned atomic.Int64
	spans := tracetest.NewSpanRecorder()
	opts := []adapters.OpenOption{
		adapters.WithLogger(slog.New(recordHandler{ch: logs})),
		adapters.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))),
		adapters.WithTLSConfig(tc),
	}

	// Without the option, the proxy's certificate is not trusted.
	if _, err := adapters.OpenSink(ctxT(t), rawURL("amqps", q), opts[:2]...); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("OpenSink without WithTLSConfig: %v, want a certificate error", err)
	}
	sink, err := adapters.OpenSink(ctxT(t), rawURL("amqps", q), opts...)
	if err != nil {
		t.Fatalf("OpenSink: %v", err)
	}
	defer sink.Close()
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "o1", Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	q.Set("consumer_timeout", "1h")
	q.Set("consumer_timeout_warn", "300ms")
	src, err := adapters.OpenSource(ctxT(t), rawURL("amqps", q), append(opts, adapters.WithMeterProvider(countingMeter{n: &warned}))...)
	if err != nil {
		t.Fatalf("OpenSource: %v", err)
	}
	defer src.Close()
	if err := src.Nack(ctxT(t), receive(t, src), 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	m := receive(t, src) // back from the wait queue; held past the warning
	waitLog(t, logs, "consumer_timeout")
	if n := warned.Load(); n != 1 {
		t.Errorf("meter counted %d warnings, want 1", n)
	}
	_ = src.Ack(ctxT(t), m)
	var names []string
	for _, s := range spans.Ended() {
		names = append(names, s.Name())
	}
	if got := strings.Join(names, ","); got != SpanPublish+","+SpanNack {
		t.Errorf("spans %q, want %s then %s", got, SpanPublish, SpanNack)
	}

	if closeConnections(t, cfg.ConnectionName) == 0 {
		t.Fatal("no connection to close")
	}
	waitLog(t, logs, "consumer channel lost")
	waitLog(t, logs, "consumer reconnected") // through TLS again

	for name, c := range map[string]struct {
		open func() error
		want error
	}{
		"sink WithMeterProvider": {func() error {
			_, err := adapters.OpenSink(ctxT(t), rawURL("amqps", url.Values{}), adapters.WithMeterProvider(countingMeter{n: &warned}))
			return err
		}, adapters.ErrUnsupportedOption},
		"source WithTLSConfig amqp://": {func() error {
			_, err := adapters.OpenSource(ctxT(t), rawURL("amqp", url.Values{}), adapters.WithTLSConfig(tc))
			return err
		}, adapters.ErrUnsupportedOption},
		"sink WithTLSConfig rabbit:// tls=false": {func() error {
			_, err := adapters.OpenSink(ctxT(t), rawURL("rabbit", url.Values{"tls": {"false"}}), adapters.WithTLSConfig(tc))
			return err
		}, adapters.ErrUnsupportedOption},
		"source WithTLSConfig beside tls_server_name": {func() error {
			_, err := adapters.OpenSource(ctxT(t), rawURL("amqps", url.Values{"tls_server_name": {"x"}}), adapters.WithTLSConfig(tc))
			return err
		}, urlparam.ErrParam},
		"source another adapter's option": {func() error {
			_, err := adapters.OpenSource(ctxT(t), rawURL("amqps", url.Values{}), adapters.WithAdapterOption(struct{}{}, 1))
			return err
		}, adapters.ErrUnsupportedOption},
	} {
		if err := c.open(); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}
