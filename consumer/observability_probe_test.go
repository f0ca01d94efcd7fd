package consumer_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/retry"
)

// observed is one outcome the Observer saw.
type observed struct {
	id      string
	o       consumer.Outcome
	elapsed time.Duration
	attempt int
}

// witness records what every observability surface of a consumer says: the
// Observer's outcomes (forwarded to NewMetrics on a manual reader), the
// handler runs (counted by the handler itself), the spans of
// middleware.Tracing and the engine's log records.
type witness struct {
	mu     sync.Mutex
	seen   []observed
	on     func(observed)
	next   consumer.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	logs   bytes.Buffer // JSON records, guarded by mu (lockedWriter)
	runs   atomic.Int64
	redeli atomic.Int64 // handler runs with Attempt > 1
}

func (w *witness) Observe(msg *ackwise.Message, o consumer.Outcome, d time.Duration) {
	w.next.Observe(msg, o, d)
	r := observed{msg.ID, o, d, msg.Attempt}
	w.mu.Lock()
	w.seen = append(w.seen, r)
	on := w.on
	w.mu.Unlock()
	if on != nil {
		on(r)
	}
}

type lockedWriter struct{ w *witness }

func (l lockedWriter) Write(p []byte) (int, error) {
	l.w.mu.Lock()
	defer l.w.mu.Unlock()
	return l.w.logs.Write(p)
}

// newWitness returns a witness and the consumer Config wired to it.
func newWitness(t *testing.T) (*witness, consumer.Config) {
	t.Helper()
	w := &witness{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	var err error
	w.next, err = consumer.NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(w.reader)), "probe")
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(w.spans))
	log := slog.New(slog.NewJSONHandler(lockedWriter{w}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return w, consumer.Config{
		Name:       "probe",
		Observer:   w,
		Logger:     log,
		Middleware: []ackwise.Middleware{middleware.Tracing(tp, middleware.TracingConfig{})},
		Retry:      retry.Policy{InitialInterval: time.Millisecond, Jitter: retry.NoJitter},
	}
}

// handler wraps h so that the witness counts its runs.
func (w *witness) handler(h func(*ackwise.Message) error) ackwise.Handler {
	return ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		w.runs.Add(1)
		if m.Attempt > 1 {
			w.redeli.Add(1)
		}
		return h(m)
	})
}

// outcomes returns the outcomes of the message id, in order.
func (w *witness) outcomes(id string) []observed {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []observed
	for _, r := range w.seen {
		if r.id == id {
			out = append(out, r)
		}
	}
	return out
}

// logRecords returns the engine's log records with the given message.
func (w *witness) logRecords(t *testing.T, msg string) []map[string]any {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(w.logs.String()), "\n") {
		if line == "" {
			continue
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

// check verifies, after Run returned, that the surfaces agree: Stats equal
// the Observer's counts, the gauges are back to zero, the metrics count each
// outcome the Observer saw, the duration histogram and the spans count the
// handler runs (runsCut of them cancelled at the drain, without a duration),
// the redeliveries count the handler runs of later attempts that got an
// outcome other than retried, and no payload is in the logs.
func (w *witness) check(t *testing.T, c *consumer.Consumer, payload string) {
	t.Helper()
	s := c.Stats()
	w.mu.Lock()
	counts := map[consumer.Outcome]uint64{}
	var runOutcomes, redeliveries int64
	for _, r := range w.seen {
		counts[r.o]++
		if r.elapsed > 0 {
			runOutcomes++
			if r.attempt > 1 && r.o != consumer.Retried {
				redeliveries++
			}
		}
		if r.o == consumer.Released && r.attempt > 1 {
			redeliveries++
		}
	}
	logs := w.logs.String()
	seen := append([]observed(nil), w.seen...)
	w.mu.Unlock()
	want := consumer.Stats{
		Received: s.Received, Panics: s.Panics, ReceiveErrors: s.ReceiveErrors, BreakerTrips: s.BreakerTrips,
		Acked: counts[consumer.Acked], Retried: counts[consumer.Retried], DeadLettered: counts[consumer.DeadLettered],
		Discarded: counts[consumer.Discarded], Released: counts[consumer.Released], SettleFailed: counts[consumer.SettleFailed],
	}
	if s != want {
		t.Errorf("Stats %+v\nwant %+v (the Observer's counts, gauges 0); observed %v", s, want, seen)
	}
	if runOutcomes != w.runs.Load() {
		t.Errorf("%d outcomes carry a run time, the handler ran %d times; observed %v", runOutcomes, w.runs.Load(), seen)
	}
	if n := int64(len(w.spans.Ended())); n != w.runs.Load() {
		t.Errorf("%d spans ended, the handler ran %d times", n, w.runs.Load())
	}

	var rm metricdata.ResourceMetrics
	if err := w.reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	messages := map[string]int64{}
	var durations uint64
	var redeliv int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case consumer.MetricMessages:
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					o, _ := dp.Attributes.Value(consumer.AttrOutcome)
					messages[o.AsString()] += dp.Value
				}
			case consumer.MetricHandlerDuration:
				for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
					durations += dp.Count
				}
			case consumer.MetricRedeliveries:
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					redeliv += dp.Value
				}
			}
		}
	}
	for o, n := range counts {
		if messages[o.String()] != int64(n) {
			t.Errorf("%s{outcome=%s} = %d, the Observer saw %d", consumer.MetricMessages, o, messages[o.String()], n)
		}
	}
	if int64(durations) != w.runs.Load() {
		t.Errorf("%s recorded %d times, the handler ran %d times", consumer.MetricHandlerDuration, durations, w.runs.Load())
	}
	if redeliv != redeliveries {
		t.Errorf("%s = %d, want %d (deliveries with Attempt > 1 that ran to an outcome other than retried, or were released); observed %v", consumer.MetricRedeliveries, redeliv, redeliveries, seen)
	}
	if strings.Contains(logs, payload) {
		t.Errorf("a log record shows the payload %q:\n%s", payload, logs)
	}
}

// setupQueue returns a broker on the system clock with the queue "orders"
// (and its dead-letter queue) holding msgs.
func setupQueue(t *testing.T, msgs ...*ackwise.Message) (*memory.Broker, *memory.QueueSource) {
	t.Helper()
	br, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"orders", "orders" + memory.DeadLetterSuffix} {
		if err := br.CreateQueue(q, memory.QueueConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	src, err := br.QueueSource("orders")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	if err := br.Publish(t.Context(), "orders", msgs...); err != nil {
		t.Fatal(err)
	}
	return br, src
}

const secret = "card=4111111111111111"

// runUntil runs c until done is closed, then stops it and waits for Run.
func runUntil(t *testing.T, c *consumer.Consumer, done <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Errorf("scenario did not finish; stats %+v", c.Stats())
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// signalOn returns a channel closed the first time cond holds for an
// outcome.
func signalOn(w *witness, cond func(observed) bool) <-chan struct{} {
	ch := make(chan struct{})
	var once sync.Once
	w.on = func(r observed) {
		if cond(r) {
			once.Do(func() { close(ch) })
		}
	}
	return ch
}

// A message retried once, then failing permanently on its redelivery, whose
// dead letter is refused twice, then written: retried, then settle-failed
// with the run time, settle-failed without, dead-lettered without; two
// runs, two spans, two durations, one redelivery; the refusals logged at
// Error, the dead letter at Warn.
func TestObservabilityDeadLetterTriedAgain(t *testing.T) {
	t.Parallel()
	br, src := setupQueue(t, &ackwise.Message{ID: "e1", Payload: []byte(secret)})
	if _, err := br.InjectFault("orders"+memory.DeadLetterSuffix, memory.Fault{Kind: memory.FaultFailPublish, Count: 2}); err != nil {
		t.Fatal(err)
	}
	w, cfg := newWitness(t)
	done := signalOn(w, func(r observed) bool { return r.o == consumer.DeadLettered })
	c, err := consumer.New(src, w.handler(func(m *ackwise.Message) error {
		if m.Attempt == 1 {
			return errors.New("db timeout")
		}
		return ackwise.Permanent(errors.New("malformed order"))
	}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, done)
	got := w.outcomes("e1")
	// Attempt 1's Retried is observed after its Nack returned; with a 1ms
	// broker delay, attempt 2 can run (and be observed) first on a busy
	// machine. Observations of one attempt come in order.
	slices.SortStableFunc(got, func(a, b observed) int { return cmp.Compare(a.attempt, b.attempt) })
	if len(got) != 4 || got[0].o != consumer.Retried || got[1].o != consumer.SettleFailed || got[1].elapsed <= 0 || got[1].attempt != 2 ||
		got[2].o != consumer.SettleFailed || got[2].elapsed != 0 || got[3].o != consumer.DeadLettered || got[3].elapsed != 0 {
		t.Fatalf("outcomes %v: want retried, settle-failed (run), settle-failed, dead-lettered", got)
	}
	w.check(t, c, secret)
	if n := len(w.logRecords(t, "settle failed; trying again in place")); n != 2 {
		t.Errorf("%d records of the refused dead letter, want 2", n)
	}
	for _, r := range w.logRecords(t, "settle failed; trying again in place") {
		if r["level"] != "ERROR" || r["outcome"] != "dead-lettered" {
			t.Errorf("record %v: want ERROR, outcome dead-lettered", r)
		}
	}
	if rs := w.logRecords(t, "dead-lettered"); len(rs) != 1 || rs[0]["level"] != "WARN" {
		t.Errorf("dead-letter records %v: want one at WARN", rs)
	}
}

// A transient failure whose Nack is refused while the queue is out, then
// made: settle-failed (run), settle-failed… (no run), retried; the next
// attempt acked and counted once as a redelivery.
func TestObservabilityNackTriedAgain(t *testing.T) {
	t.Parallel()
	br, src := setupQueue(t, &ackwise.Message{ID: "e1", Payload: []byte(secret)})
	w, cfg := newWitness(t)
	cfg.RetryMode = consumer.RetryBroker
	done := signalOn(w, func(r observed) bool { return r.o == consumer.Acked })
	c, err := consumer.New(src, w.handler(func(m *ackwise.Message) error {
		if m.Attempt == 1 {
			br.Outage(30*time.Millisecond, "orders")
			return errors.New("db timeout")
		}
		return nil
	}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, done)
	got := w.outcomes("e1")
	n := len(got)
	if n < 3 || got[0].o != consumer.SettleFailed || got[0].elapsed <= 0 ||
		got[n-2].o != consumer.Retried || got[n-2].elapsed != 0 || got[n-1].o != consumer.Acked || got[n-1].attempt != 2 {
		t.Fatalf("outcomes %v: want settle-failed (run), settle-failed…, retried, acked at attempt 2", got)
	}
	for _, r := range got[1 : n-2] {
		if r.o != consumer.SettleFailed || r.elapsed != 0 {
			t.Fatalf("outcomes %v: want settle-failed without a run between the first and retried", got)
		}
	}
	w.check(t, c, secret)
	if rs := w.logRecords(t, "settle failed; trying again in place"); len(rs) != n-2 {
		t.Errorf("%d records of the refused nack, want %d", len(rs), n-2)
	}
}

// The drain while a refused dead letter waits to be tried again: observed
// once per try, as settle-failed, never as released; the gauges back to 0
// and the message back in the queue.
func TestObservabilityDrainWhileMoveWaits(t *testing.T) {
	t.Parallel()
	br, src := setupQueue(t, &ackwise.Message{ID: "e1", Payload: []byte(secret)})
	if _, err := br.InjectFault("orders"+memory.DeadLetterSuffix, memory.Fault{Kind: memory.FaultFailPublish}); err != nil {
		t.Fatal(err)
	}
	w, cfg := newWitness(t)
	done := signalOn(w, func(r observed) bool { return r.o == consumer.SettleFailed })
	c, err := consumer.New(src, w.handler(func(*ackwise.Message) error {
		return ackwise.Permanent(errors.New("malformed order"))
	}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, done)
	for _, r := range w.outcomes("e1") {
		if r.o != consumer.SettleFailed {
			t.Fatalf("outcomes %v: want settle-failed only", w.outcomes("e1"))
		}
	}
	w.check(t, c, secret)
	if msgs, err := br.Messages("orders"); err != nil || len(msgs) != 1 {
		t.Fatalf("queue holds %d messages (%v), want the one handed back", len(msgs), err)
	}
}

// A failed ack of the first of three messages of one key: it is handed back
// (settle-failed), the messages behind it that were queued are released,
// and every message ends acked exactly once.
func TestObservabilityFailedAckReleasesBehind(t *testing.T) {
	t.Parallel()
	msgs := []*ackwise.Message{
		{ID: "e1", Key: "k", Payload: []byte(secret)},
		{ID: "e2", Key: "k", Payload: []byte(secret)},
		{ID: "e3", Key: "k", Payload: []byte(secret)},
	}
	br, src := setupQueue(t, msgs...)
	if _, err := br.InjectFault("orders", memory.Fault{Kind: memory.FaultFailAck, Count: 1,
		Match: func(m *ackwise.Message) bool { return m.ID == "e1" }}); err != nil {
		t.Fatal(err)
	}
	w, cfg := newWitness(t)
	cfg.Ordering = consumer.OrderKey
	var acked atomic.Int64
	done := signalOn(w, func(r observed) bool { return r.o == consumer.Acked && acked.Add(1) == 3 })
	c, err := consumer.New(src, w.handler(func(*ackwise.Message) error { return nil }), cfg)
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, done)
	for _, m := range msgs {
		got := w.outcomes(m.ID)
		if len(got) == 0 || got[len(got)-1].o != consumer.Acked {
			t.Fatalf("%s: outcomes %v, want the last acked", m.ID, got)
		}
		for _, r := range got[:len(got)-1] {
			if r.o == consumer.Acked {
				t.Fatalf("%s: outcomes %v, acked twice", m.ID, got)
			}
		}
	}
	if got := w.outcomes("e1"); got[0].o != consumer.SettleFailed || got[0].elapsed <= 0 {
		t.Fatalf("e1: outcomes %v, want settle-failed with its run first", got)
	}
	w.check(t, c, secret)
	if rs := w.logRecords(t, "settle failed; the broker will redeliver"); len(rs) != 1 || rs[0]["level"] != "ERROR" || rs[0]["outcome"] != "acked" {
		t.Errorf("failed-ack records %v: want one at ERROR", rs)
	}
}

// A panic and a discard: dead-lettered and discarded, each with its run;
// Stats.Panics 1; the panic logged at Error, the discard at Debug.
func TestObservabilityPanicAndDiscard(t *testing.T) {
	t.Parallel()
	_, src := setupQueue(t,
		&ackwise.Message{ID: "boom", Payload: []byte(secret)},
		&ackwise.Message{ID: "drop", Payload: []byte(secret)})
	w, cfg := newWitness(t)
	var n atomic.Int64
	done := signalOn(w, func(observed) bool { return n.Add(1) == 2 })
	c, err := consumer.New(src, w.handler(func(m *ackwise.Message) error {
		if m.ID == "boom" {
			panic("nil order")
		}
		return ackwise.Discard(errors.New("stale"))
	}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, done)
	if got := w.outcomes("boom"); len(got) != 1 || got[0].o != consumer.DeadLettered || got[0].elapsed <= 0 {
		t.Errorf("boom: outcomes %v, want dead-lettered with its run", got)
	}
	if got := w.outcomes("drop"); len(got) != 1 || got[0].o != consumer.Discarded || got[0].elapsed <= 0 {
		t.Errorf("drop: outcomes %v, want discarded with its run", got)
	}
	if s := c.Stats(); s.Panics != 1 {
		t.Errorf("Stats.Panics = %d, want 1", s.Panics)
	}
	w.check(t, c, secret)
	if rs := w.logRecords(t, "handler panicked"); len(rs) != 1 || rs[0]["level"] != "ERROR" {
		t.Errorf("panic records %v: want one at ERROR", rs)
	}
	if rs := w.logRecords(t, "discarded"); len(rs) != 1 || rs[0]["level"] != "DEBUG" {
		t.Errorf("discard records %v: want one at DEBUG", rs)
	}
}
