package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/internal/scope"
	"github.com/ackwise/ackwise/retry"
)

// gaugeBundle is a consumer on a memory queue under a virtual clock, its
// metrics read through a manual reader.
type gaugeBundle struct {
	br     *memory.Broker
	clk    *memory.VirtualClock
	src    *memory.QueueSource
	reader *sdkmetric.ManualReader
	obs    consumer.Observer
}

func setupGauges(t *testing.T, opts ...consumer.MetricsOption) *gaugeBundle {
	t.Helper()
	b := &gaugeBundle{reader: sdkmetric.NewManualReader()}
	b.br, b.clk = memorytest.NewBroker(t)
	// The lease outlasts every advance of the virtual clock: lease
	// extension is not what these tests look at.
	if err := b.br.CreateQueue("orders", memory.QueueConfig{Lease: 10 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	var err error
	if b.src, err = b.br.QueueSource("orders"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.src.Close() })
	b.obs, err = consumer.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(b.reader)), "billing", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// run starts c and stops it when the test ends.
func (b *gaugeBundle) run(t *testing.T, c *consumer.Consumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

// point is one data point: its value and attributes.
type point struct {
	value float64
	attrs attribute.Set
}

// collect reads every metric, by name; it checks the scope's name and
// version.
func (b *gaugeBundle) collect(t *testing.T) map[string][]point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := b.reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string][]point{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != consumer.MeterName || sm.Scope.Version != scope.Version() || sm.Scope.Version == "" {
			t.Errorf("scope %q version %q, want %q version %q", sm.Scope.Name, sm.Scope.Version, consumer.MeterName, scope.Version())
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					got[m.Name] = append(got[m.Name], point{dp.Value, dp.Attributes})
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					got[m.Name] = append(got[m.Name], point{float64(dp.Value), dp.Attributes})
				}
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					got[m.Name] = append(got[m.Name], point{float64(dp.Value), dp.Attributes})
				}
			}
		}
	}
	return got
}

// value returns the one data point of name with attributes attrs, failing
// the test when there is none.
func value(t *testing.T, got map[string][]point, name string, attrs ...attribute.KeyValue) float64 {
	t.Helper()
	want := attribute.NewSet(slices.Clone(attrs)...) // NewSet sorts its argument in place
	for _, p := range got[name] {
		if p.attrs.Equals(&want) {
			return p.value
		}
	}
	t.Fatalf("no %s{%s}; got %v", name, want.Encoded(attribute.DefaultEncoder()), got[name])
	return 0
}

var (
	billing     = attribute.String(consumer.AttrConsumer, "billing")
	orders      = attribute.String(consumer.AttrSource, "orders")
	forBilling  = []attribute.KeyValue{billing}
	ordersOfBil = []attribute.KeyValue{orders, billing}
)

// TestMetricsLagGrowsAndDrains blocks the handler on three messages and
// reads the lag twice as virtual time passes: it grows by what passed,
// from the broker's timestamp of the oldest; once the handler returns and
// the messages are settled, the lag and in-flight read 0.
func TestMetricsLagGrowsAndDrains(t *testing.T) {
	t.Parallel()
	b := setupGauges(t)
	release := make(chan struct{})
	started := make(chan string, 3)
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
		started <- m.ID
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	// Published 30s before the consumer sees them: the lag counts from
	// the broker's timestamp, not from the receive.
	memorytest.Publish(t, b.br, "orders", memorytest.Msg("a", "a", "x"))
	b.clk.Advance(10 * time.Second)
	memorytest.Publish(t, b.br, "orders", memorytest.Msg("b", "b", "x"), memorytest.Msg("c", "c", "x"))
	b.clk.Advance(20 * time.Second)
	c, err := consumer.New(b.src, h, consumer.Config{Name: "billing", Observer: b.obs, Clock: b.clk, Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	b.run(t, c)
	for range 3 {
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the handler did not start on the three messages")
		}
	}
	first := b.collect(t)
	if got := value(t, first, consumer.MetricLagAge, ordersOfBil...); got != 30 {
		t.Errorf("lag = %vs, want 30s (the oldest message's broker timestamp)", got)
	}
	if got := value(t, first, consumer.MetricInFlight, forBilling...); got != 3 {
		t.Errorf("in flight = %v, want 3", got)
	}
	if got := value(t, first, consumer.MetricWaiting, forBilling...); got != 0 {
		t.Errorf("waiting = %v, want 0", got)
	}
	if _, ok := first[consumer.MetricBreakerState]; ok {
		t.Errorf("breaker state observed without a breaker: %v", first[consumer.MetricBreakerState])
	}
	if _, ok := first[consumer.MetricLagMessages]; ok {
		t.Errorf("lag in messages observed without WithBacklog: %v", first[consumer.MetricLagMessages])
	}
	b.clk.Advance(45 * time.Second)
	second := b.collect(t)
	if got := value(t, second, consumer.MetricLagAge, ordersOfBil...); got != 75 {
		t.Errorf("lag after 45s more = %vs, want 75s", got)
	}
	close(release)
	if !waitStats(c, 30*time.Second, func(s consumer.Stats) bool { return s.Acked == 3 && s.InFlight == 0 }) {
		t.Fatalf("not settled: %+v", c.Stats())
	}
	after := b.collect(t)
	if got := value(t, after, consumer.MetricLagAge, ordersOfBil...); got != 0 {
		t.Errorf("lag after the drain = %vs, want 0", got)
	}
	if got := value(t, after, consumer.MetricInFlight, forBilling...); got != 0 {
		t.Errorf("in flight after the drain = %v, want 0", got)
	}
}

// TestMetricsWaitingInPlace: a message whose retry waits in place is in
// flight and waiting, and its lag goes on growing while it waits.
func TestMetricsWaitingInPlace(t *testing.T) {
	t.Parallel()
	b := setupGauges(t)
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.Attempt == 1 {
			return errors.New("db timeout")
		}
		return nil
	})
	memorytest.Publish(t, b.br, "orders", memorytest.Msg("a", "a", "x"))
	c, err := consumer.New(b.src, h, consumer.Config{
		Name: "billing", Observer: b.obs, Clock: b.clk, RetryMode: consumer.RetryInPlace,
		Retry: retry.Policy{InitialInterval: 5 * time.Hour, Jitter: retry.NoJitter, MaxInterval: 5 * time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	b.run(t, c)
	memorytest.WaitForTimer(t, b.clk, 5*time.Hour) // the retry's wait (longer than the heartbeat's, 10h/3), scheduled
	b.clk.Advance(time.Minute)
	got := b.collect(t)
	if v := value(t, got, consumer.MetricWaiting, forBilling...); v != 1 {
		t.Errorf("waiting = %v, want 1", v)
	}
	if v := value(t, got, consumer.MetricInFlight, forBilling...); v != 1 {
		t.Errorf("in flight = %v, want 1", v)
	}
	if v := value(t, got, consumer.MetricLagAge, ordersOfBil...); v != 60 {
		t.Errorf("lag = %vs, want 60s", v)
	}
}

var errGateway = errors.New("payment gateway: 503")

// TestMetricsBreaker forces the breaker open (Threshold 1: the first
// transient failure opens it), then lets a probe run and succeed: the
// state reads open, half-open while the probe runs, then closed; trips
// counts one.
func TestMetricsBreaker(t *testing.T) {
	t.Parallel()
	b := setupGauges(t)
	var mu sync.Mutex
	down := true
	probing := make(chan struct{})
	release := make(chan struct{})
	h := ackwise.HandlerFunc(func(ctx context.Context, _ *ackwise.Message) error {
		mu.Lock()
		d := down
		mu.Unlock()
		if d {
			return errGateway
		}
		probing <- struct{}{}
		<-release
		return nil
	})
	memorytest.Publish(t, b.br, "orders", memorytest.Msg("a", "a", "x"))
	c, err := consumer.New(b.src, h, consumer.Config{
		Name: "billing", Observer: b.obs, Clock: b.clk, RetryMode: consumer.RetryInPlace,
		Breaker: &consumer.Breaker{Threshold: 1, ProbeInterval: 4 * time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	b.run(t, c)
	if !waitStats(c, 30*time.Second, func(s consumer.Stats) bool { return s.Paused && s.Held == 1 }) {
		t.Fatalf("breaker did not open holding the message: %+v", c.Stats())
	}
	open := b.collect(t)
	for name, want := range map[string]float64{
		consumer.MetricBreakerState: consumer.BreakerOpen,
		consumer.MetricBreakerTrips: 1,
		consumer.MetricBreakerHeld:  1,
		consumer.MetricInFlight:     1,
	} {
		if v := value(t, open, name, forBilling...); v != want {
			t.Errorf("open: %s = %v, want %v", name, v, want)
		}
	}
	mu.Lock()
	down = false
	mu.Unlock()
	memorytest.WaitForTimer(t, b.clk, 4*time.Hour)
	b.clk.Advance(4 * time.Hour)
	select {
	case <-probing:
	case <-time.After(30 * time.Second):
		t.Fatal("no probe ran")
	}
	half := b.collect(t)
	if v := value(t, half, consumer.MetricBreakerState, forBilling...); v != consumer.BreakerHalfOpen {
		t.Errorf("probing: state = %v, want %d (half-open); %+v", v, consumer.BreakerHalfOpen, c.Stats())
	}
	if v := value(t, half, consumer.MetricBreakerHeld, forBilling...); v != 0 {
		t.Errorf("probing: held = %v, want 0 (the probe is not held)", v)
	}
	close(release)
	if !waitStats(c, 30*time.Second, func(s consumer.Stats) bool { return !s.Paused && s.Acked == 1 && s.InFlight == 0 }) {
		t.Fatalf("breaker did not close: %+v", c.Stats())
	}
	closed := b.collect(t)
	if v := value(t, closed, consumer.MetricBreakerState, forBilling...); v != consumer.BreakerClosed {
		t.Errorf("closed: state = %v, want 0", v)
	}
	if v := value(t, closed, consumer.MetricBreakerTrips, forBilling...); v != 1 {
		t.Errorf("closed: trips = %v, want 1", v)
	}
}

// backlogAnswer is one answer of fakeBacklog.
type backlogAnswer struct {
	n   int
	err error
}

// fakeBacklog answers Backlog with what the test sends it.
type fakeBacklog chan backlogAnswer

func (f fakeBacklog) Backlog(ctx context.Context) (int, error) {
	select {
	case a := <-f:
		return a.n, a.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// TestMetricsBacklogAndDrainTime feeds the backlog poll answers one
// interval apart: the lag in messages is the last answer, the drain time
// the backlog over its shrinking rate, -1 when it grows, and both are left
// out after a failed answer.
func TestMetricsBacklogAndDrainTime(t *testing.T) {
	t.Parallel()
	const every = 4 * time.Hour // longer than the lease heartbeat's timer (10h/3): WaitForTimer finds the poll's
	answers := make(fakeBacklog)
	b := setupGauges(t, consumer.WithBacklog(answers, every))
	c, err := consumer.New(b.src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil }),
		consumer.Config{Name: "billing", Observer: b.obs, Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	b.run(t, c)
	step := func(a backlogAnswer) map[string][]point {
		t.Helper()
		answers <- a
		// The next poll's timer is set once the answer is kept.
		memorytest.WaitForTimer(t, b.clk, every)
		got := b.collect(t)
		b.clk.Advance(every)
		return got
	}
	got := step(backlogAnswer{n: 7200})
	if v := value(t, got, consumer.MetricLagMessages, forBilling...); v != 7200 {
		t.Errorf("lag.messages = %v, want 7200", v)
	}
	if v := value(t, got, consumer.MetricDrainTime, forBilling...); v != -1 {
		t.Errorf("drain time from one sample = %v, want -1", v)
	}
	got = step(backlogAnswer{n: 3600}) // 3600 less in 4h: 0.25/s, 3600 left: 4h
	if v := value(t, got, consumer.MetricDrainTime, forBilling...); v != 4*3600 {
		t.Errorf("drain time = %vs, want 14400s", v)
	}
	got = step(backlogAnswer{err: errors.New("broker down")})
	if _, ok := got[consumer.MetricLagMessages]; ok {
		t.Errorf("lag.messages observed after a failed poll: %v", got[consumer.MetricLagMessages])
	}
	if _, ok := got[consumer.MetricDrainTime]; ok {
		t.Errorf("drain time observed after a failed poll: %v", got[consumer.MetricDrainTime])
	}
	got = step(backlogAnswer{n: 9000}) // grew past the first sample: not draining
	if v := value(t, got, consumer.MetricLagMessages, forBilling...); v != 9000 {
		t.Errorf("lag.messages = %v, want 9000", v)
	}
	if v := value(t, got, consumer.MetricDrainTime, forBilling...); v != -1 {
		t.Errorf("drain time while growing = %v, want -1", v)
	}
}

func TestMetricsOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		opt  consumer.MetricsOption
		want string
	}{
		{consumer.WithBacklog(nil, time.Second), "Backlogger is nil"},
		{consumer.WithBacklog(make(fakeBacklog), 10*time.Millisecond), "interval = 10ms: at least 1s"},
	} {
		_, err := consumer.NewMetrics(nil, "x", tc.opt)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewMetrics: %v, want an error containing %q", err, tc.want)
		}
	}
	if _, err := consumer.NewMetrics(nil, "x", consumer.WithBacklog(make(fakeBacklog), 0), nil); err != nil {
		t.Errorf("NewMetrics with defaults: %v", err)
	}
}

// TestMetricsGaugesOfOneConsumer: an Observer given to two consumers counts
// the outcomes of both and observes the gauges of the first.
func TestMetricsGaugesOfOneConsumer(t *testing.T) {
	t.Parallel()
	b := setupGauges(t)
	noop := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })
	first, err := consumer.New(b.src, noop, consumer.Config{Name: "billing", Observer: b.obs, Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	other, err := b.br.QueueSource("other")
	if err != nil {
		t.Fatal(err)
	}
	// Closed after the consumers stop (cleanups run last first): a defer
	// would close it under the running consumer, whose Run then fails.
	t.Cleanup(func() { other.Close() })
	second, err := consumer.New(other, noop, consumer.Config{Name: "billing", Observer: b.obs, Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	memorytest.Publish(t, b.br, "other", memorytest.Msg("a", "a", "x"))
	b.run(t, second)
	if !waitStats(second, 30*time.Second, func(s consumer.Stats) bool { return s.Acked == 1 }) {
		t.Fatalf("second consumer: %+v", second.Stats())
	}
	if got := b.collect(t); len(got[consumer.MetricInFlight]) != 0 {
		t.Errorf("the second consumer's gauges are observed: %v", got[consumer.MetricInFlight])
	}
	memorytest.Publish(t, b.br, "orders", memorytest.Msg("b", "b", "x"))
	b.run(t, first)
	if !waitStats(first, 30*time.Second, func(s consumer.Stats) bool { return s.Acked == 1 && s.InFlight == 0 }) {
		t.Fatalf("first consumer: %+v", first.Stats())
	}
	got := b.collect(t)
	if v := value(t, got, consumer.MetricInFlight, forBilling...); v != 0 {
		t.Errorf("in flight = %v", v)
	}
	if v := value(t, got, consumer.MetricMessages, attribute.String(consumer.AttrOutcome, "acked"), attribute.String(consumer.AttrSource, "other"), billing); v != 1 {
		t.Errorf("the second consumer's outcomes: acked = %v, want 1", v)
	}
}

// TestMetricsGaugesWhileRunning: the gauges are observed while Run runs,
// not before nor after it, and again when the consumer runs again.
func TestMetricsGaugesWhileRunning(t *testing.T) {
	t.Parallel()
	b := setupGauges(t)
	noop := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })
	c, err := consumer.New(b.src, noop, consumer.Config{Name: "billing", Observer: b.obs, Clock: b.clk})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.collect(t); len(got[consumer.MetricInFlight]) != 0 {
		t.Fatalf("before Run: %v", got)
	}
	for run := 1; run <= 2; run++ {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		memorytest.Publish(t, b.br, "orders", memorytest.Msg(fmt.Sprint("e", run), "k", "x"))
		if !waitStats(c, 30*time.Second, func(s consumer.Stats) bool { return s.Acked == uint64(run) && s.InFlight == 0 }) {
			t.Fatalf("run %d: %+v", run, c.Stats())
		}
		if v := value(t, b.collect(t), consumer.MetricInFlight, forBilling...); v != 0 {
			t.Errorf("run %d: in flight %v", run, v)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		if got := b.collect(t); len(got[consumer.MetricInFlight]) != 0 || len(got[consumer.MetricLagAge]) != 0 {
			t.Errorf("after run %d returned: %v", run, got)
		}
	}
}
