package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// MetricsOption configures NewMetrics.
type MetricsOption func(*metricsOptions)

type metricsOptions struct {
	backlog      dlq.Backlogger
	backlogEvery time.Duration
	backlogSet   bool
}

// Defaults and bounds of WithBacklog.
const (
	DefaultBacklogInterval = 30 * time.Second
	MinBacklogInterval     = time.Second
	// DrainWindowSamples is how many backlog samples the drain estimate
	// spans: it compares the newest with the one DrainWindowSamples
	// intervals before it (5 minutes at the default interval).
	DrainWindowSamples = 10
)

// WithBacklog makes the Observer of NewMetrics ask b, every interval while
// Run runs (and as it starts), how many messages the source's broker holds
// for the consumer, for ackwise.consumer.lag.messages and the drain
// estimate ackwise.consumer.lag.drain_time (EstimateDrain over the last
// DrainWindowSamples intervals). b is usually the consumer's source: the
// Kafka source (its group's lag over the topic and its retry topics) and
// the SQS source (the queue's approximate count) implement dlq.Backlogger.
// RabbitMQ's Source.Backlog answers only before its first delivery, so it
// reports nothing here (the gauge is left out while Backlog fails).
//
// interval 0 means DefaultBacklogInterval (30s); less than
// MinBacklogInterval (1s) is refused by NewMetrics: every call is a request
// to the broker (three on Kafka), whatever the collection rate. A call is
// bounded by interval; one that fails leaves both gauges out until one
// succeeds, and is logged (Warn on the first failure in a row, Debug after).
func WithBacklog(b dlq.Backlogger, interval time.Duration) MetricsOption {
	return func(o *metricsOptions) {
		o.backlog, o.backlogEvery, o.backlogSet = b, interval, true
	}
}

func (o *metricsOptions) validate() error {
	if !o.backlogSet {
		return nil
	}
	switch {
	case o.backlog == nil:
		return errors.New("consumer: WithBacklog: the Backlogger is nil")
	case o.backlogEvery == 0:
		o.backlogEvery = DefaultBacklogInterval
	case o.backlogEvery < MinBacklogInterval:
		return fmt.Errorf("consumer: WithBacklog: interval = %v: at least %v (0 means %v)", o.backlogEvery, MinBacklogInterval, DefaultBacklogInterval)
	}
	return nil
}

// gaugeInstruments are the asynchronous instruments of NewMetrics.
type gaugeInstruments struct {
	lagAge       metric.Float64ObservableGauge
	lagMessages  metric.Int64ObservableGauge
	drainTime    metric.Float64ObservableGauge
	inFlight     metric.Int64ObservableUpDownCounter
	waiting      metric.Int64ObservableUpDownCounter
	held         metric.Int64ObservableUpDownCounter
	breakerState metric.Int64ObservableGauge
	trips        metric.Int64ObservableCounter
}

func (g *gaugeInstruments) create(meter metric.Meter) error {
	var err, e error
	g.lagAge, e = meter.Float64ObservableGauge(MetricLagAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest message in flight (received, not settled), from its broker timestamp."))
	err = errors.Join(err, e)
	g.lagMessages, e = meter.Int64ObservableGauge(MetricLagMessages, metric.WithUnit("{message}"),
		metric.WithDescription("Messages the broker holds for the consumer, as it reports them."))
	err = errors.Join(err, e)
	g.drainTime, e = meter.Float64ObservableGauge(MetricDrainTime, metric.WithUnit("s"),
		metric.WithDescription("Estimated time to drain the backlog at the measured rates; -1 when it does not shrink."))
	err = errors.Join(err, e)
	g.inFlight, e = meter.Int64ObservableUpDownCounter(MetricInFlight, metric.WithUnit("{message}"),
		metric.WithDescription("Messages received and not yet settled."))
	err = errors.Join(err, e)
	g.waiting, e = meter.Int64ObservableUpDownCounter(MetricWaiting, metric.WithUnit("{message}"),
		metric.WithDescription("Messages in flight waiting in place: retries in place, held redeliveries, failed moves."))
	err = errors.Join(err, e)
	g.held, e = meter.Int64ObservableUpDownCounter(MetricBreakerHeld, metric.WithUnit("{message}"),
		metric.WithDescription("Messages the open breaker holds."))
	err = errors.Join(err, e)
	g.breakerState, e = meter.Int64ObservableGauge(MetricBreakerState, metric.WithUnit("1"),
		metric.WithDescription("Breaker state: 0 closed, 1 half-open (a probe running), 2 open."))
	err = errors.Join(err, e)
	g.trips, e = meter.Int64ObservableCounter(MetricBreakerTrips, metric.WithUnit("{trip}"),
		metric.WithDescription("Times the breaker opened."))
	return errors.Join(err, e)
}

func (g *gaugeInstruments) all() []metric.Observable {
	return []metric.Observable{g.lagAge, g.lagMessages, g.drainTime, g.inFlight, g.waiting, g.held, g.breakerState, g.trips}
}

// gauges observes one consumer's gauges for the metrics it claimed.
type gauges struct {
	m   *metrics
	c   *Consumer
	set metric.MeasurementOption // ackwise.consumer.name

	mu      sync.Mutex // guards the fields below
	samples []backlogSample
	failing bool // the last Backlog call failed
}

// backlogSample is one answer of the backlog source: its count, when, and
// how many messages the consumer had consumed then.
type backlogSample struct {
	at       time.Time
	backlog  int64
	consumed int64
}

// claimGauges gives c the gauges of m, unless another consumer has them.
func (m *metrics) claimGauges(c *Consumer) *gauges {
	if !m.claimed.CompareAndSwap(false, true) {
		c.log.Warn("the metrics Observer is already another consumer's: this consumer's gauges (lag, in flight, breaker) are not observed; give each consumer a NewMetrics of its own")
		return nil
	}
	return &gauges{m: m, c: c, set: metric.WithAttributeSet(attribute.NewSet(m.consumer))}
}

// start registers the callback and starts polling the backlog source, for
// one Run; the function it returns undoes both.
func (g *gauges) start() (stop func()) {
	reg, err := g.m.meter.RegisterCallback(g.observe, g.m.gauges.all()...)
	if err != nil {
		g.c.log.Warn("registering the consumer's gauges failed", slog.Any(ackwise.LogKeyError, err))
		reg = nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if g.m.opts.backlog != nil {
		wg.Go(func() { g.pollBacklog(ctx) })
	}
	return func() {
		cancel()
		wg.Wait()
		if reg != nil {
			_ = reg.Unregister()
		}
	}
}

type sourceAge struct {
	source string
	age    time.Duration
}

// observe is the callback of the consumer's gauges.
func (g *gauges) observe(_ context.Context, o metric.Observer) error {
	c, in := g.c, &g.m.gauges
	now := c.clock.Now()
	var lags []sourceAge
	c.mu.Lock()
	inflight, waiting := c.inflight, len(c.holds.waiting)
	b := c.breaker
	var held, trips int
	state := BreakerClosed
	if b != nil {
		held, trips = len(b.held), b.trips
		switch {
		case b.open && b.probing != nil:
			state = BreakerHalfOpen
		case b.open:
			state = BreakerOpen
		}
	}
	c.ages.oldestLocked(now, func(src string, age time.Duration) { lags = append(lags, sourceAge{src, age}) })
	c.mu.Unlock()

	o.ObserveInt64(in.inFlight, int64(inflight), g.set)
	o.ObserveInt64(in.waiting, int64(waiting), g.set)
	if b != nil {
		o.ObserveInt64(in.held, int64(held), g.set)
		o.ObserveInt64(in.breakerState, int64(state), g.set)
		o.ObserveInt64(in.trips, int64(trips), g.set)
	}
	for _, l := range lags {
		o.ObserveFloat64(in.lagAge, l.age.Seconds(), metric.WithAttributeSet(attribute.NewSet(attribute.String(AttrSource, l.source), g.m.consumer)))
	}
	if backlog, drain, ok := g.backlog(); ok {
		o.ObserveInt64(in.lagMessages, backlog, g.set)
		secs := -1.0
		if drain.Draining() {
			secs = drain.Time.Seconds()
		}
		o.ObserveFloat64(in.drainTime, secs, g.set)
	}
	return nil
}

// backlog returns the last backlog sample and the drain estimate over the
// samples kept; ok is false while the last Backlog call failed, or before
// the first. The estimate is NotDraining until there are two samples.
func (g *gauges) backlog() (backlog int64, d Drain, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := len(g.samples)
	if n == 0 || g.failing {
		return 0, Drain{}, false
	}
	first, last := g.samples[0], g.samples[n-1]
	if n == 1 {
		if last.backlog == 0 {
			return 0, Drain{}, true // empty: drained
		}
		return last.backlog, Drain{Time: NotDraining}, true
	}
	return last.backlog, EstimateDrain(first.backlog, last.backlog, last.consumed-first.consumed, last.at.Sub(first.at)), true
}

// pollBacklog samples the backlog source now and every interval until ctx
// ends.
func (g *gauges) pollBacklog(ctx context.Context) {
	every := g.m.opts.backlogEvery
	for {
		g.sampleBacklog(ctx, every)
		if !g.c.sleep(ctx, every) {
			return
		}
	}
}

// sampleBacklog asks the backlog source once, bounded by timeout, and keeps
// the answer with the last DrainWindowSamples+1 ones.
func (g *gauges) sampleBacklog(run context.Context, timeout time.Duration) {
	c := g.c
	ctx, cancel := context.WithTimeout(run, timeout)
	n, err := g.m.opts.backlog.Backlog(ctx)
	cancel()
	o := &c.stats.outcomes
	s := backlogSample{at: c.clock.Now(), backlog: int64(n), consumed: int64(o[Acked].Load() + o[DeadLettered].Load() + o[Discarded].Load())}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil || n < 0 {
		if run.Err() != nil {
			return // Run stopped
		}
		lvl := slog.LevelDebug
		if !g.failing {
			lvl = slog.LevelWarn
		}
		g.failing = true
		if err == nil {
			err = fmt.Errorf("consumer: the backlog source answered %d", n)
		}
		c.log.Log(run, lvl, "asking the broker for the backlog failed; ackwise.consumer.lag.messages is left out until it answers", slog.Any(ackwise.LogKeyError, err))
		return
	}
	g.failing = false
	if len(g.samples) > DrainWindowSamples {
		copy(g.samples, g.samples[1:])
		g.samples = g.samples[:DrainWindowSamples]
	}
	g.samples = append(g.samples, s)
}
