package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/producer/outbox"
	"github.com/ackwise/ackwise/retry"
)

// Wait bounds every wait of the suite: generous, for a busy 2-core
// machine.
const Wait = 60 * time.Second

// Backend is one fresh outbox table, removed when the test ends.
type Backend struct {
	// Store is the table's store.
	Store outbox.Store
	// Add adds msgs in a new transaction of the caller's kind and commits
	// it, or rolls it back when commit is false.
	Add func(ctx context.Context, commit bool, msgs ...*ackwise.Message) error
	// SentRows counts the rows marked sent, pruned ones not included.
	SentRows func(ctx context.Context) (int64, error)
	// Corrupt overwrites the stored headers of the row of eventID with
	// bytes the store cannot decode, in the table directly.
	Corrupt func(ctx context.Context, eventID string) error
	// LastError returns the last_error recorded on the row of eventID.
	LastError func(ctx context.Context, eventID string) (string, error)
}

// Harness makes backends.
type Harness struct {
	// New returns a fresh backend for t (its table dropped at t's end).
	New func(t *testing.T) *Backend
}

// Run runs the suite, each case as a subtest.
func Run(t *testing.T, h Harness) {
	t.Run("WholeMessage", func(t *testing.T) { t.Parallel(); testWholeMessage(t, h) })
	t.Run("RollbackPublishesNothing", func(t *testing.T) { t.Parallel(); testRollback(t, h) })
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("Relays%d", n), func(t *testing.T) { t.Parallel(); testParallelRelays(t, h, n) })
	}
	t.Run("OutageDrains", func(t *testing.T) { t.Parallel(); testOutage(t, h) })
	t.Run("PoisonParked", func(t *testing.T) { t.Parallel(); testPoison(t, h) })
	t.Run("UnreadableParked", func(t *testing.T) { t.Parallel(); testUnreadable(t, h) })
	t.Run("DrainReleases", func(t *testing.T) { t.Parallel(); testDrain(t, h) })
	t.Run("Prune", func(t *testing.T) { t.Parallel(); testPrune(t, h) })
}

// Bundle is a backend, a memory broker queue and what the relays report.
type Bundle struct {
	*Backend
	Broker *memory.Broker
	Queue  string
	Sink   *memory.Sink
	Reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
	guard  keyGuard
}

// keyGuard wraps the sink of every relay of a bundle and counts the
// Publish calls that carried a key another call had in flight.
type keyGuard struct {
	mu         sync.Mutex
	inFlight   map[string]bool
	violations []string
}

type guardedSink struct {
	adapters.Sink
	g *keyGuard
}

func (s guardedSink) Publish(ctx context.Context, msgs ...*ackwise.Message) error {
	g := s.g
	g.mu.Lock()
	var mine []string
	for _, m := range msgs {
		if m.Key == "" {
			continue
		}
		if g.inFlight[m.Key] {
			g.violations = append(g.violations, m.Key)
			continue
		}
		g.inFlight[m.Key] = true
		mine = append(mine, m.Key)
	}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		for _, k := range mine {
			delete(g.inFlight, k)
		}
		g.mu.Unlock()
	}()
	return s.Sink.Publish(ctx, msgs...)
}

// CheckOneInFlightPerKey fails t if two publishes ever carried rows of one
// key at the same time.
func (b *Bundle) CheckOneInFlightPerKey(t *testing.T) {
	t.Helper()
	b.guard.mu.Lock()
	defer b.guard.mu.Unlock()
	if len(b.guard.violations) > 0 {
		t.Errorf("rows of one key were in flight twice at once, keys %v", b.guard.violations)
	}
}

// NewBundle returns a backend of h with a queue to relay into.
func NewBundle(t *testing.T, h Harness) *Bundle {
	t.Helper()
	b := &Bundle{Backend: h.New(t), Queue: "outbox", guard: keyGuard{inFlight: map[string]bool{}}}
	var err error
	if b.Broker, err = memory.New(memory.Config{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Broker.CreateQueue(b.Queue, memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	if b.Sink, err = b.Broker.Sink(b.Queue); err != nil {
		t.Fatal(err)
	}
	b.Reader = sdkmetric.NewManualReader()
	b.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(b.Reader))
	t.Cleanup(func() { _ = b.mp.Shutdown(context.Background()) })
	return b
}

// FastConfig is a relay configuration that polls and retries quickly.
func (b *Bundle) FastConfig() outbox.Config {
	return outbox.Config{
		BatchSize:     16,
		PollInterval:  20 * time.Millisecond,
		Lease:         20 * time.Second,
		Publish:       producer.Config{Retry: retry.Policy{MaxAttempts: 2, InitialInterval: 5 * time.Millisecond, MaxInterval: 10 * time.Millisecond}},
		RowRetry:      retry.Policy{InitialInterval: 20 * time.Millisecond, MaxInterval: 100 * time.Millisecond},
		MeterProvider: b.mp,
	}
}

// StartRelay runs a relay of cfg until the returned stop is called (or the
// test ends); stop returns Run's error.
func (b *Bundle) StartRelay(t *testing.T, cfg outbox.Config) (*outbox.Relay, func() error) {
	t.Helper()
	r, err := outbox.NewRelay(b.Store, guardedSink{Sink: b.Sink, g: &b.guard}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(Wait):
				runErr = errors.New("relay did not stop")
			}
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return r, stop
}

// WaitPublished waits until the queue holds at least n messages.
func (b *Bundle) WaitPublished(t *testing.T, n int) []*ackwise.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), Wait)
	defer cancel()
	err := b.Broker.WaitHistory(ctx, b.Queue, func(ev []memory.Event) bool {
		k := 0
		for _, e := range ev {
			if e.Kind == memory.EventPublished {
				k++
			}
		}
		return k >= n
	})
	msgs, merr := b.Broker.Messages(b.Queue)
	if merr != nil {
		t.Fatal(merr)
	}
	if err != nil {
		t.Fatalf("waiting for %d published messages: %v (have %d)", n, err, len(msgs))
	}
	return msgs
}

// WaitStats waits until cond holds for the store's Stats.
func (b *Bundle) WaitStats(t *testing.T, what string, cond func(outbox.Stats) bool) outbox.Stats {
	t.Helper()
	deadline := time.Now().Add(Wait)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := b.Store.Stats(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: stats still %+v", what, st)
		}
		<-tick.C
	}
}

// Counter returns the sum of the counter name over all attributes.
func (b *Bundle) Counter(t *testing.T, name string) int64 {
	t.Helper()
	return Counter(t, b.Reader, name)
}

// Counter returns the sum of the counter or gauge name that reader
// collects, over all attributes.
func Counter(t *testing.T, reader sdkmetric.Reader, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					n += p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					n += p.Value
				}
			}
		}
	}
	return n
}

// Seq is the payload of row seq of key.
func Seq(key string, seq int) *ackwise.Message {
	return &ackwise.Message{Key: key, Payload: fmt.Appendf(nil, "%s/%06d", key, seq)}
}

// AddKeyed adds rows from to from+perKey-1 of each of keys, interleaved,
// in transactions of batch rows each, and returns their event IDs.
func (b *Bundle) AddKeyed(t *testing.T, keys []string, from, perKey, batch int) []string {
	t.Helper()
	var all []*ackwise.Message
	for i := from; i < from+perKey; i++ {
		for _, k := range keys {
			all = append(all, Seq(k, i))
		}
	}
	var ids []string
	for c := range slices.Chunk(all, batch) {
		if err := b.Add(t.Context(), true, c...); err != nil {
			t.Fatal(err)
		}
		for _, m := range c {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// CheckOnceInOrder fails t unless msgs holds each of ids exactly once and
// the payloads of each key (made by Seq) come in ascending order.
func CheckOnceInOrder(t *testing.T, msgs []*ackwise.Message, ids []string) {
	t.Helper()
	seen := map[string]int{}
	for _, m := range msgs {
		seen[m.EventID()]++
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("event %s published %d times, want 1", id, seen[id])
		}
	}
	if len(msgs) != len(ids) {
		t.Errorf("%d messages published for %d rows", len(msgs), len(ids))
	}
	last := map[string]int{}
	for _, m := range msgs {
		key, n, ok := strings.Cut(string(m.Payload), "/")
		seq, err := strconv.Atoi(n)
		if !ok || err != nil || key != m.Key {
			t.Fatalf("unexpected payload %q for key %q", m.Payload, m.Key)
		}
		if prev, ok := last[key]; ok && seq <= prev {
			t.Errorf("key %s: row %d published after row %d", key, seq, prev)
		}
		last[key] = seq
	}
}

func keys(n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("k%02d", i)
	}
	return ks
}

func testWholeMessage(t *testing.T, h Harness) {
	b := NewBundle(t, h)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:  trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(t.Context(), sc)
	given := &ackwise.Message{ID: "given-id", Key: "k\x00\xff", Payload: []byte{0, 1, 2, 0xff},
		Headers: ackwise.Headers{{Key: "a", Value: "1"}, {Key: "a", Value: "2\x00\xfe"}, {Key: "", Value: ""}}}
	fresh := &ackwise.Message{Payload: nil}
	inHeader := &ackwise.Message{Headers: ackwise.HeadersOf(ackwise.HeaderEventID, "from-header", "traceparent", "00-0102030405060708090a0b0c0d0e0f10-0102030405060709-01")}
	hdrBefore := given.Headers.Clone()
	if err := b.Add(ctx, true, given, fresh, inHeader); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(given.Headers, hdrBefore) {
		t.Errorf("Add changed the caller's headers: %v", given.Headers)
	}
	if u, err := uuid.Parse(fresh.ID); err != nil || u.Version() != 7 {
		t.Errorf("a message without an ID got ID %q (%v), want a UUIDv7", fresh.ID, err)
	}
	if inHeader.ID != "from-header" {
		t.Errorf("a message with its ID in the header got ID %q", inHeader.ID)
	}
	_, stop := b.StartRelay(t, b.FastConfig())
	msgs := b.WaitPublished(t, 3)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	byID := map[string]*ackwise.Message{}
	for _, m := range msgs {
		byID[m.EventID()] = m
	}
	g := byID["given-id"]
	if g == nil || g.Key != given.Key || string(g.Payload) != string(given.Payload) {
		t.Fatalf("given message published as %+v", g)
	}
	for _, kv := range given.Headers {
		if !slices.Contains(g.Headers, kv) {
			t.Errorf("header %q=%q lost; published %v", kv.Key, kv.Value, g.Headers)
		}
	}
	if want := "00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01"; g.Headers.Get(ackwise.HeaderTraceparent) != want {
		t.Errorf("traceparent = %q, want the caller's span %q", g.Headers.Get(ackwise.HeaderTraceparent), want)
	}
	if f := byID[fresh.ID]; f == nil || len(f.Payload) != 0 {
		t.Errorf("fresh message published as %+v", f)
	}
	if m := byID["from-header"]; m == nil || m.Headers.Get(ackwise.HeaderTraceparent) != "00-0102030405060708090a0b0c0d0e0f10-0102030405060709-01" {
		t.Errorf("a message's own traceparent was not kept: %+v", m)
	}
	if n := b.Counter(t, outbox.MetricPublished); n != 3 {
		t.Errorf("%s = %d, want 3", outbox.MetricPublished, n)
	}
	if st, err := b.Store.Stats(t.Context()); err != nil || st.Backlog != 0 || !st.Oldest.IsZero() {
		t.Errorf("Stats after relaying everything = %+v, %v", st, err)
	}
}

func testRollback(t *testing.T, h Harness) {
	b := NewBundle(t, h)
	rolled := &ackwise.Message{Key: "k", Payload: []byte("rolled back")}
	if err := b.Add(t.Context(), false, rolled); err != nil {
		t.Fatal(err)
	}
	committed := &ackwise.Message{Key: "k", Payload: []byte("committed")}
	if err := b.Add(t.Context(), true, committed); err != nil {
		t.Fatal(err)
	}
	_, stop := b.StartRelay(t, b.FastConfig())
	b.WaitPublished(t, 1)
	// The relay reached the committed row, the rolled-back one before it
	// would have gone first; one more full idle round makes sure.
	b.WaitStats(t, "empty backlog", func(s outbox.Stats) bool { return s.Backlog == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	msgs, _ := b.Broker.Messages(b.Queue)
	if len(msgs) != 1 || msgs[0].EventID() != committed.ID {
		t.Fatalf("published %d messages (%v), want only the committed one %s", len(msgs), msgs, committed.ID)
	}
}

func testParallelRelays(t *testing.T, h Harness, n int) {
	b := NewBundle(t, h)
	ids := b.AddKeyed(t, keys(12), 0, 25, 40)
	for range n {
		cfg := b.FastConfig()
		cfg.BatchSize = 5
		cfg.Workers = 2
		b.StartRelay(t, cfg)
	}
	msgs := b.WaitPublished(t, len(ids))
	b.WaitStats(t, "empty backlog", func(s outbox.Stats) bool { return s.Backlog == 0 })
	// More rows while they run, to race claims against fresh heads.
	more := b.AddKeyed(t, keys(12)[:6], 25, 10, 7)
	msgs = b.WaitPublished(t, len(ids)+len(more))
	b.WaitStats(t, "empty backlog", func(s outbox.Stats) bool { return s.Backlog == 0 })
	msgs, _ = b.Broker.Messages(b.Queue)
	CheckOnceInOrder(t, msgs, append(ids, more...))
	b.CheckOneInFlightPerKey(t)
}

func testOutage(t *testing.T, h Harness) {
	b := NewBundle(t, h)
	b.Broker.Outage(time.Hour, b.Queue)
	ids := b.AddKeyed(t, keys(5), 0, 10, 10)
	b.StartRelay(t, b.FastConfig())
	ctx, cancel := context.WithTimeout(t.Context(), Wait)
	defer cancel()
	for b.Counter(t, outbox.MetricPublishErrors) < 20 {
		if ctx.Err() != nil {
			t.Fatal("no publish errors counted during the outage")
		}
		time.Sleep(5 * time.Millisecond) // polling a counter: there is no signal to await
	}
	st := b.WaitStats(t, "the backlog", func(s outbox.Stats) bool { return s.Backlog == 50 })
	if st.Oldest.IsZero() {
		t.Error("Stats.Oldest is zero with a backlog")
	}
	ids = append(ids, b.AddKeyed(t, keys(5), 10, 4, 20)...)
	b.WaitStats(t, "a grown backlog", func(s outbox.Stats) bool { return s.Backlog == 70 })
	if g := b.Counter(t, outbox.MetricBacklog); g != 70 {
		t.Errorf("%s gauge = %d, want 70", outbox.MetricBacklog, g)
	}
	if msgs, _ := b.Broker.Messages(b.Queue); len(msgs) != 0 {
		t.Fatalf("%d messages stored during the outage", len(msgs))
	}
	b.Broker.Outage(0, b.Queue)
	b.WaitPublished(t, len(ids))
	b.WaitStats(t, "empty backlog", func(s outbox.Stats) bool { return s.Backlog == 0 && s.Parked == 0 })
	msgs, _ := b.Broker.Messages(b.Queue)
	CheckOnceInOrder(t, msgs, ids)
	b.CheckOneInFlightPerKey(t)
}

func testPoison(t *testing.T, h Harness) {
	b := NewBundle(t, h)
	poison := Seq("p", 0)
	rows := []*ackwise.Message{poison, Seq("p", 1), Seq("a", 0), Seq("a", 1)}
	if err := b.Add(t.Context(), true, rows...); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Broker.InjectFault(b.Queue, memory.Fault{Kind: memory.FaultFailPublish,
		Match: func(m *ackwise.Message) bool { return m.EventID() == poison.ID },
		Err:   ackwise.Permanent(errors.New("message refused"))}); err != nil {
		t.Fatal(err)
	}
	_, stop := b.StartRelay(t, b.FastConfig())
	msgs := b.WaitPublished(t, 3)
	st := b.WaitStats(t, "one parked row", func(s outbox.Stats) bool { return s.Backlog == 0 && s.Parked == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	CheckOnceInOrder(t, msgs, []string{rows[1].ID, rows[2].ID, rows[3].ID})
	if n := b.Counter(t, outbox.MetricParked); n != 1 {
		t.Errorf("%s = %d, want 1", outbox.MetricParked, n)
	}
	if st.Parked != 1 {
		t.Errorf("Stats.Parked = %d", st.Parked)
	}
}

func testUnreadable(t *testing.T, h Harness) {
	b := NewBundle(t, h)
	if b.Corrupt == nil || b.LastError == nil {
		t.Fatal("the harness's Backend must set Corrupt and LastError")
	}
	bad := Seq("p", 1)
	rows := []*ackwise.Message{Seq("p", 0), bad, Seq("p", 2), Seq("a", 0)}
	if err := b.Add(t.Context(), true, rows...); err != nil {
		t.Fatal(err)
	}
	if err := b.Corrupt(t.Context(), bad.ID); err != nil {
		t.Fatal(err)
	}
	_, stop := b.StartRelay(t, b.FastConfig())
	msgs := b.WaitPublished(t, 3)
	b.WaitStats(t, "one parked row", func(s outbox.Stats) bool { return s.Backlog == 0 && s.Parked == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	CheckOnceInOrder(t, msgs, []string{rows[0].ID, rows[2].ID, rows[3].ID})
	if n := b.Counter(t, outbox.MetricParked); n != 1 {
		t.Errorf("%s = %d, want 1", outbox.MetricParked, n)
	}
	if n := b.Counter(t, outbox.MetricPublishErrors); n != 0 {
		t.Errorf("%s = %d, want 0", outbox.MetricPublishErrors, n)
	}
	reason, err := b.LastError(t.Context(), bad.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, "unreadable") || !strings.Contains(reason, "corrupt headers") {
		t.Errorf("parked row's last_error = %q, want the decoding error", reason)
	}
}

func testDrain(t *testing.T, h Harness) {
	b := NewBundle(t, h)
	hang, err := b.Broker.InjectFault(b.Queue, memory.Fault{Kind: memory.FaultHangPublish, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	ids := b.AddKeyed(t, keys(3), 0, 2, 6)
	cfg := b.FastConfig()
	cfg.DrainTimeout = 200 * time.Millisecond
	cfg.Lease = time.Hour // only the release lets another relay take the rows
	cfg.PublishTimeout = 30 * time.Minute
	_, stop := b.StartRelay(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), Wait)
	defer cancel()
	for hang.Fired() == 0 {
		if ctx.Err() != nil {
			t.Fatal("publish never hung")
		}
		time.Sleep(5 * time.Millisecond) // polling the fault: there is no signal to await
	}
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > Wait/2 {
		t.Errorf("drain took %v with a DrainTimeout of 200ms", d)
	}
	// A second relay takes the released rows at once (their lease was an
	// hour) and publishes them with the same event IDs.
	b.StartRelay(t, b.FastConfig())
	b.WaitPublished(t, len(ids))
	b.WaitStats(t, "empty backlog", func(s outbox.Stats) bool { return s.Backlog == 0 })
	msgs, _ := b.Broker.Messages(b.Queue)
	CheckOnceInOrder(t, msgs, ids)
}

func testPrune(t *testing.T, h Harness) {
	b := NewBundle(t, h)
	ids := b.AddKeyed(t, keys(2), 0, 3, 6)
	cfg := b.FastConfig()
	cfg.Retention = time.Millisecond
	cfg.PruneInterval = 10 * time.Millisecond
	b.StartRelay(t, cfg)
	b.WaitPublished(t, len(ids))
	b.WaitStats(t, "empty backlog", func(s outbox.Stats) bool { return s.Backlog == 0 })
	deadline := time.Now().Add(Wait)
	for {
		n, err := b.SentRows(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sent rows left after the retention", n)
		}
		time.Sleep(10 * time.Millisecond) // polling the table: there is no signal to await
	}
}
