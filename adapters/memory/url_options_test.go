package memory_test

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
)

// logRecords is a slog.Handler keeping every record's message and "fault"
// attribute.
type logRecords struct {
	mu  sync.Mutex
	got []string // "message fault"
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "fault" {
			line += " " + a.Value.String()
		}
		return true
	})
	l.got = append(l.got, line)
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

func (l *logRecords) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.got)
}

// counts returns the sums of the int64 counters in rm, by metric name and
// the value of memory.AttrFault.
func counts(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				f, _ := dp.Attributes.Value(memory.AttrFault)
				out[m.Name+" "+f.AsString()] += dp.Value
			}
		}
	}
	return out
}

// TestURLOptions: a source and a sink opened by URL take a logger, a meter
// provider and a tracer provider, and report each injected fault and crash
// through all three; WithBroker picks the broker; a TLS config and another
// adapter's option are refused.
func TestURLOptions(t *testing.T) {
	ctx := context.Background()
	b, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	logs := &logRecords{}
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	opts := []adapters.OpenOption{
		memory.WithBroker(b),
		adapters.WithLogger(slog.New(logs)),
		adapters.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
		adapters.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))),
	}
	src, err := adapters.OpenSource(ctx, "mem://orders?max_receives=3", opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if _, err := b.Stats("orders"); err != nil {
		t.Fatalf("the queue is not on the broker WithBroker gave: %v", err)
	}
	if _, err := memory.Default().Stats("orders"); !errors.Is(err, memory.ErrNotFound) {
		t.Fatalf("the queue is on Default(): %v", err)
	}
	sink, err := adapters.OpenSink(ctx, "mem://orders", opts...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.InjectFault("orders", memory.Fault{Kind: memory.FaultFailPublish, Count: 1}); err != nil {
		t.Fatal(err)
	}
	if err := sink.Publish(ctx, &ackwise.Message{ID: "a"}); !errors.Is(err, memory.ErrInjected) {
		t.Fatalf("Publish: %v, want the injected failure", err)
	}
	if err := sink.Publish(ctx, &ackwise.Message{ID: "a"}); err != nil {
		t.Fatal(err)
	}
	qs := src.(*memory.QueueSource)
	if _, err := qs.InjectFault(memory.Fault{Kind: memory.FaultLoseAck, Count: 1}); err != nil {
		t.Fatal(err)
	}
	if err := src.Ack(ctx, recvOne(t, src)); err != nil {
		t.Fatal(err)
	}
	qs.Crash()

	want := []string{"memory: injected fault fired fail-publish", "memory: injected fault fired lose-ack", "memory: source crashed crash"}
	if got := logs.lines(); !slices.Equal(got, want) {
		t.Errorf("log records %q, want %q", got, want)
	}
	if got, want := counts(t, reader), map[string]int64{memory.MetricFaults + " fail-publish": 1, memory.MetricFaults + " lose-ack": 1, memory.MetricCrashes + " crash": 1}; !maps.Equal(got, want) {
		t.Errorf("counts %v, want %v", got, want)
	}
	if got := len(spans.Ended()); got != 3 {
		t.Errorf("%d spans ended, want 3 (one per fault or crash)", got)
	}
	for _, s := range spans.Ended() {
		if s.Name() != memory.SpanFault {
			t.Errorf("span %q, want %q", s.Name(), memory.SpanFault)
		}
	}

	// A closed source's observer is dropped at its next event, and reports
	// nothing more.
	logsBefore := len(logs.lines())
	src2, err := adapters.OpenSource(ctx, "mem://orders", opts...)
	if err != nil {
		t.Fatal(err)
	}
	src2.Close()
	src2.(*memory.QueueSource).Crash()
	if got := logs.lines(); len(got) != logsBefore {
		t.Errorf("a closed source reported %q", got[logsBefore:])
	}

	for name, opt := range map[string]adapters.OpenOption{
		"WithTLSConfig":            adapters.WithTLSConfig(&tls.Config{}),
		"another adapter's option": adapters.WithAdapterOption(otherAdapterKey{}, 1),
	} {
		if _, err := adapters.OpenSource(ctx, "mem://orders", append(opts, opt)...); !errors.Is(err, adapters.ErrUnsupportedOption) {
			t.Errorf("OpenSource with %s: %v, want ErrUnsupportedOption", name, err)
		}
		if _, err := adapters.OpenSink(ctx, "mem://orders", append(opts, opt)...); !errors.Is(err, adapters.ErrUnsupportedOption) {
			t.Errorf("OpenSink with %s: %v, want ErrUnsupportedOption", name, err)
		}
	}
}

type otherAdapterKey struct{}
