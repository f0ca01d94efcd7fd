package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ackwise/ackwise/internal/scope"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Instrument names and the attribute key of the relay's metrics (see
// [NewRelay]).
const (
	MetricPublished     = "ackwise.outbox.published"
	MetricPublishErrors = "ackwise.outbox.publish.errors"
	MetricParked        = "ackwise.outbox.parked"
	MetricBacklog       = "ackwise.outbox.backlog"
	MetricOldestAge     = "ackwise.outbox.oldest.age"
	MetricParkedRows    = "ackwise.outbox.parked.rows"
	AttrOwner           = "ackwise.outbox.owner"
)

// MeterName is the instrumentation scope name of the relay's meter.
const MeterName = "github.com/ackwise/ackwise/producer/outbox"

type metrics struct {
	meter   metric.Meter
	attrs   metric.MeasurementOption
	pub     metric.Int64Counter
	errs    metric.Int64Counter
	parked  metric.Int64Counter
	backlog metric.Int64ObservableGauge
	oldest  metric.Float64ObservableGauge
	parkedN metric.Int64ObservableGauge
}

func newMetrics(mp metric.MeterProvider, owner string) (*metrics, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := &metrics{meter: mp.Meter(MeterName, metric.WithInstrumentationVersion(scope.Version())), attrs: metric.WithAttributes(attribute.String(AttrOwner, owner))}
	var err, e error
	m.pub, e = m.meter.Int64Counter(MetricPublished, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows confirmed by the broker and marked sent."))
	err = errors.Join(err, e)
	m.errs, e = m.meter.Int64Counter(MetricPublishErrors, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows whose publish failed."))
	err = errors.Join(err, e)
	m.parked, e = m.meter.Int64Counter(MetricParked, metric.WithUnit("{message}"),
		metric.WithDescription("Outbox rows parked by this relay."))
	err = errors.Join(err, e)
	m.backlog, e = m.meter.Int64ObservableGauge(MetricBacklog, metric.WithUnit("{row}"),
		metric.WithDescription("Outbox rows neither sent nor parked."))
	err = errors.Join(err, e)
	m.oldest, e = m.meter.Float64ObservableGauge(MetricOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest outbox row neither sent nor parked."))
	err = errors.Join(err, e)
	m.parkedN, e = m.meter.Int64ObservableGauge(MetricParkedRows, metric.WithUnit("{row}"),
		metric.WithDescription("Parked outbox rows."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, errors.Join(errors.New("outbox: creating metric instruments"), err)
	}
	return m, nil
}

func (m *metrics) published(n int) { m.pub.Add(context.Background(), int64(n), m.attrs) }

func (m *metrics) publishErrors(n int) { m.errs.Add(context.Background(), int64(n), m.attrs) }

func (m *metrics) parkedRow() { m.parked.Add(context.Background(), 1, m.attrs) }

// observeStats registers the gauges' callback, which reads store's Stats,
// and returns its unregistration.
func (m *metrics) observeStats(store Store) (func(), error) {
	reg, err := m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, statsTimeout)
		defer cancel()
		st, err := store.Stats(ctx)
		if err != nil {
			return err
		}
		age := 0.0
		if !st.Oldest.IsZero() {
			age = max(0, time.Since(st.Oldest).Seconds())
		}
		o.ObserveInt64(m.backlog, st.Backlog, m.attrs)
		o.ObserveFloat64(m.oldest, age, m.attrs)
		o.ObserveInt64(m.parkedN, st.Parked, m.attrs)
		return nil
	}, m.backlog, m.oldest, m.parkedN)
	if err != nil {
		return nil, fmt.Errorf("outbox: registering the gauges: %w", err)
	}
	return func() { _ = reg.Unregister() }, nil
}
