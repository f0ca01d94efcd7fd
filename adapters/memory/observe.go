package memory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise/adapters"
)

// The names of what a source or sink opened by URL reports through the
// options it was given ([adapters.WithLogger], [adapters.WithMeterProvider],
// [adapters.WithTracerProvider]).
const (
	// InstrumentationName names the meter and the tracer.
	InstrumentationName = "github.com/ackwise/ackwise/adapters/memory"
	// MetricFaults counts the injected faults that fired, by fault
	// (AttrFault) and destination.
	MetricFaults = "ackwise.memory.faults"
	// MetricCrashes counts the crashes of sources, injected or by Crash.
	MetricCrashes = "ackwise.memory.crashes"
	// SpanFault is the name of the span of a fault or a crash.
	SpanFault = "memory fault"
	// AttrFault is the fault's name ("lose-ack"; "crash" for Crash()).
	AttrFault = "ackwise.memory.fault"
)

// observer reports the injected faults and crashes of one source or sink
// opened by URL: a Warn log record, a count, and a span of its own (a
// source's faults have no caller's context; a sink's span is a child of
// Publish's ctx). A source's observer is called from dest.record, with the
// destination's lock held: the logger's handler, the meter and the tracer
// must not call the broker.
type observer struct {
	log     *slog.Logger
	faults  metric.Int64Counter
	crashes metric.Int64Counter
	tracer  trace.Tracer
	src     *source // the source observed; nil for a sink
}

// brokerKey is the key of WithBroker's adapter option.
type brokerKey struct{}

// WithBroker is an option of [adapters.OpenSource] and [adapters.OpenSink]
// for "mem://" URLs: open the destination on b instead of [Default].
func WithBroker(b *Broker) adapters.OpenOption { return adapters.WithAdapterOption(brokerKey{}, b) }

// openOptions reads the options of a "mem://" URL: the broker (Default
// unless WithBroker) and the observer (nil when neither a logger, a meter
// provider nor a tracer provider is given). A TLS config is refused: the
// broker has no network connection to secure.
func openOptions(o adapters.OpenOptions) (*Broker, *observer, error) {
	if err := o.CheckAdapterOptions("memory", brokerKey{}); err != nil {
		return nil, nil, err
	}
	if o.TLS != nil {
		return nil, nil, adapters.UnsupportedOption("memory", "WithTLSConfig", "the in-memory broker has no network connection to secure")
	}
	b := Default()
	if v, ok := o.AdapterOption(brokerKey{}); ok {
		b, _ = v.(*Broker)
		if b == nil {
			return nil, nil, fmt.Errorf("memory: WithBroker(nil)")
		}
	}
	if o.Logger == nil && o.MeterProvider == nil && o.TracerProvider == nil {
		return b, nil, nil
	}
	ob := &observer{log: o.Logger}
	if mp := o.MeterProvider; mp != nil {
		m := mp.Meter(InstrumentationName)
		var err1, err2 error
		ob.faults, err1 = m.Int64Counter(MetricFaults, metric.WithUnit("{fault}"), metric.WithDescription("Injected faults that fired on a source or sink opened by URL."))
		ob.crashes, err2 = m.Int64Counter(MetricCrashes, metric.WithUnit("{crash}"), metric.WithDescription("Crashes of a source opened by URL, injected or by Crash."))
		if err := errors.Join(err1, err2); err != nil {
			return nil, nil, fmt.Errorf("memory: create metric: %w", err)
		}
	}
	if tp := o.TracerProvider; tp != nil {
		ob.tracer = tp.Tracer(InstrumentationName)
	}
	return b, ob, nil
}

// report logs, counts and traces ev, an EventFault or an EventCrashed.
func (ob *observer) report(ctx context.Context, ev Event) {
	msg, fault, counter := "memory: injected fault fired", ev.Fault.String(), ob.faults
	if ev.Kind == EventCrashed {
		msg, counter = "memory: source crashed", ob.crashes
		if ev.Fault == 0 {
			fault = "crash"
		}
	}
	attrs := []attribute.KeyValue{attribute.String(AttrFault, fault), attribute.String("messaging.destination.name", ev.Dest)}
	if ob.log != nil {
		ob.log.LogAttrs(ctx, slog.LevelWarn, msg, slog.String("fault", fault), slog.String("destination", ev.Dest), slog.String("source", ev.Consumer), slog.String("id", ev.ID))
	}
	if counter != nil {
		counter.Add(ctx, 1, metric.WithAttributes(attrs...))
	}
	if ob.tracer != nil {
		_, span := ob.tracer.Start(ctx, SpanFault, trace.WithAttributes(append(attrs, attribute.String("messaging.message.id", ev.ID))...))
		span.End()
	}
}

// observe makes ob report the faults and crashes of the source s, whose
// destination is d, until s is closed. The observers of closed sources
// are dropped here and at their next event, so they do not pile up.
func (d *dest) observe(s *source, ob *observer) {
	if ob == nil {
		return
	}
	ob.src = s
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.observers == nil {
		d.observers = map[string]*observer{}
	}
	maps.DeleteFunc(d.observers, func(_ string, o *observer) bool { return o.src.closed.Load() })
	d.observers[s.id] = ob
}

// notify passes ev to the observer of its source, if any. Caller holds
// d.mu.
func (d *dest) notify(ev Event) {
	ob := d.observers[ev.Consumer]
	if ob == nil {
		return
	}
	if ob.src.closed.Load() {
		delete(d.observers, ev.Consumer)
		return
	}
	if ev.Kind == EventFault || ev.Kind == EventCrashed {
		ob.report(context.Background(), ev)
	}
}
