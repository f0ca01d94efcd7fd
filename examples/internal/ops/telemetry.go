package ops

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Traces names where spans go: TracesNone or TracesStdout.
const (
	TracesNone   = "none"   // no spans recorded (a no-op provider)
	TracesStdout = "stdout" // spans written as JSON, one object per span
)

// Telemetry holds the providers to pass to ackwise and the handler that
// serves the metrics.
type Telemetry struct {
	// Meter records to a Prometheus registry of its own (not the global
	// one), served by Metrics.
	Meter metric.MeterProvider
	// Tracer is the tracer provider: the SDK's with the chosen exporter, or
	// a no-op.
	Tracer trace.TracerProvider
	// Metrics serves the registry in the Prometheus text format, for
	// consumer.RunnerConfig.Metrics.
	Metrics http.Handler
	// Logger writes JSON lines.
	Logger *slog.Logger

	shutdown []func(context.Context) error
}

// NewTelemetry sets up metrics exported to Prometheus (the process's Go
// runtime and process collectors beside ackwise's instruments), traces as
// traces says (TracesNone or TracesStdout, written to traceOut), and JSON
// logs at level to logOut (nil writers discard). service is the
// service.name resource attribute.
func NewTelemetry(service, traces string, traceOut io.Writer, level slog.Level, logOut io.Writer) (*Telemetry, error) {
	traceOut = cmp.Or(traceOut, io.Discard)
	logOut = cmp.Or(logOut, io.Discard)
	res := resource.NewSchemaless(attribute.String("service.name", service))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res))
	t := &Telemetry{
		Meter:    mp,
		Metrics:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		Logger:   slog.New(slog.NewJSONHandler(logOut, &slog.HandlerOptions{Level: level})),
		shutdown: []func(context.Context) error{mp.Shutdown},
	}
	switch traces {
	case TracesNone, "":
		t.Tracer = noop.NewTracerProvider()
	case TracesStdout:
		exp, err := stdouttrace.New(stdouttrace.WithWriter(traceOut))
		if err != nil {
			return nil, err
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		t.Tracer = tp
		t.shutdown = append(t.shutdown, tp.Shutdown)
	default:
		return nil, fmt.Errorf("traces %q: want %s or %s", traces, TracesNone, TracesStdout)
	}
	return t, nil
}

// Shutdown flushes the spans not written yet and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}
