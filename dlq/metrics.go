package dlq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/internal/scope"
)

// MeterName is the instrumentation scope name of the meter of
// NewDepthMetrics. Its version is ackwise's module version.
const MeterName = "github.com/ackwise/ackwise/dlq"

// Instruments of NewDepthMetrics, with the attribute
// messaging.destination.name (DepthMetricsConfig.Destination) when set.
const (
	// MetricDepth is the number of dead letters the destination holds, as
	// its Backlogger reports it ({message}).
	MetricDepth = "ackwise.dlq.depth"
	// MetricOldestAge is the age of the oldest dead letter, in seconds (0
	// when there is none), from DepthMetricsConfig.Oldest.
	MetricOldestAge = "ackwise.dlq.oldest.age"
	// AttrDestination is the attribute key naming the destination.
	AttrDestination = "messaging.destination.name"
)

// Defaults and bounds of DepthMetricsConfig.Interval.
const (
	DefaultDepthInterval = 30 * time.Second
	MinDepthInterval     = time.Second
	// maxDepthCall bounds one call to the broker.
	maxDepthCall = 10 * time.Second
)

// Ager is implemented by dead-letter sources that can tell how old their
// oldest dead letter is: Oldest returns when it was dead-lettered (or
// published to the destination), and ok false when the destination is
// empty. It is called from a metrics collection, at most once per
// DepthMetricsConfig.Interval.
type Ager interface {
	Oldest(ctx context.Context) (at time.Time, ok bool, err error)
}

// AgerFunc is a function that is an Ager.
type AgerFunc func(ctx context.Context) (time.Time, bool, error)

// Oldest calls f.
func (f AgerFunc) Oldest(ctx context.Context) (time.Time, bool, error) { return f(ctx) }

// DepthMetricsConfig configures NewDepthMetrics. The zero value means the
// documented defaults.
type DepthMetricsConfig struct {
	// Destination names the dead-letter queue or topic in the attribute
	// messaging.destination.name. Default empty: left out.
	Destination string
	// Interval is how long an answer of the broker is reported before it is
	// asked again: a collection within Interval of the last call reports
	// that call's answer, so scrapes, however often, cost the broker at
	// most one call (three requests on Kafka) per Interval. Default
	// DefaultDepthInterval (30s); at least MinDepthInterval (1s).
	Interval time.Duration
	// Oldest, when set, tells the age of the oldest dead letter, for
	// ackwise.dlq.oldest.age: the Kafka source implements Ager (the
	// RabbitMQ, SQS and Pub/Sub ones cannot tell it without taking a
	// message; docs/observability.md says why). Default nil: that gauge is
	// left out.
	Oldest Ager
	// Clock is the time source of the interval and the age. Default
	// ackwise.SystemClock.
	Clock ackwise.Clock
}

// DepthMetrics observes the depth (and, with an Ager, the oldest age) of a
// dead-letter destination. Close it to stop.
type DepthMetrics struct {
	src   Backlogger
	cfg   DepthMetricsConfig
	set   metric.MeasurementOption
	depth metric.Int64ObservableGauge
	age   metric.Float64ObservableGauge
	reg   metric.Registration

	mu      sync.Mutex // held across a call to the broker: one at a time
	asked   time.Time  // when the broker was last asked; zero: never
	n       int
	nErr    error
	oldest  time.Time
	hasOld  bool
	oldErr  error
	closeMu sync.Once
}

// NewDepthMetrics registers ackwise.dlq.depth, polled from src (the
// dead-letter destination's source: the Kafka and SQS sources implement
// Backlogger), and ackwise.dlq.oldest.age when cfg.Oldest is set, as
// observable gauges with the meter provider mp (nil: a no-op). The broker
// is asked during a collection, at most once per cfg.Interval, each call
// bounded by the interval (10s at most); a call that fails leaves its
// gauge out of the collections until a later call succeeds (Err says
// why). Open src for this alone: a source that
// consumes (RabbitMQ's, which is pushed deliveries as it opens) may hold
// what it counts. An invalid config is an error naming the field.
func NewDepthMetrics(mp metric.MeterProvider, src Backlogger, cfg DepthMetricsConfig) (*DepthMetrics, error) {
	switch {
	case src == nil:
		return nil, errors.New("dlq: NewDepthMetrics: the Backlogger is nil")
	case cfg.Interval == 0:
		cfg.Interval = DefaultDepthInterval
	case cfg.Interval < MinDepthInterval:
		return nil, fmt.Errorf("dlq: DepthMetricsConfig.Interval = %v: at least %v (0 means %v)", cfg.Interval, MinDepthInterval, DefaultDepthInterval)
	}
	if cfg.Clock == nil {
		cfg.Clock = ackwise.SystemClock
	}
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	var attrs []attribute.KeyValue
	if cfg.Destination != "" {
		attrs = append(attrs, attribute.String(AttrDestination, cfg.Destination))
	}
	d := &DepthMetrics{src: src, cfg: cfg, set: metric.WithAttributeSet(attribute.NewSet(attrs...))}
	meter := mp.Meter(MeterName, metric.WithInstrumentationVersion(scope.Version()))
	var err, e error
	d.depth, e = meter.Int64ObservableGauge(MetricDepth, metric.WithUnit("{message}"),
		metric.WithDescription("Dead letters the destination holds, as the broker reports them."))
	err = errors.Join(err, e)
	d.age, e = meter.Float64ObservableGauge(MetricOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest dead letter; 0 when there is none."))
	err = errors.Join(err, e)
	if err == nil {
		d.reg, err = meter.RegisterCallback(d.observe, d.depth, d.age)
	}
	if err != nil {
		return nil, fmt.Errorf("dlq: creating the depth metrics: %w", err)
	}
	return d, nil
}

// Close unregisters the gauges. It does not close the source.
func (d *DepthMetrics) Close() error {
	var err error
	d.closeMu.Do(func() { err = d.reg.Unregister() })
	return err
}

// Err returns the error of the last call to the broker (the depth's, else
// the oldest age's), nil after a success: a gauge left out of collections
// says why here.
func (d *DepthMetrics) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return errors.Join(d.nErr, d.oldErr)
}

func (d *DepthMetrics) observe(ctx context.Context, o metric.Observer) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.cfg.Clock.Now()
	if d.asked.IsZero() || now.Sub(d.asked) >= d.cfg.Interval {
		d.asked = now
		d.ask(ctx)
	}
	if d.nErr == nil {
		o.ObserveInt64(d.depth, int64(d.n), d.set)
	}
	if d.cfg.Oldest != nil && d.oldErr == nil {
		age := 0.0
		if d.hasOld {
			age = max(now.Sub(d.oldest), 0).Seconds()
		}
		o.ObserveFloat64(d.age, age, d.set)
	}
	return nil
}

// ask asks the broker for the depth and the oldest dead letter. Caller
// holds d.mu.
func (d *DepthMetrics) ask(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, min(d.cfg.Interval, maxDepthCall))
	defer cancel()
	d.n, d.nErr = d.src.Backlog(ctx)
	if d.nErr == nil && d.n < 0 {
		d.nErr = fmt.Errorf("dlq: the Backlogger answered %d", d.n)
	}
	if d.cfg.Oldest != nil {
		d.oldest, d.hasOld, d.oldErr = d.cfg.Oldest.Oldest(ctx)
	}
}
