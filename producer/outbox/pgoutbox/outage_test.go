package pgoutbox_test

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/rabbitmq"
	"github.com/ackwise/ackwise/internal/tcpproxy"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/producer/outbox"
	"github.com/ackwise/ackwise/producer/outbox/outboxtest"
	"github.com/ackwise/ackwise/producer/outbox/pgoutbox"
	"github.com/ackwise/ackwise/retry"
)

// brokerOutage is how long RabbitMQ is unreachable in TestRabbitMQOutage.
const brokerOutage = 30 * time.Second

// witness consumes a queue with amqp091-go (auto-ack) and keeps what it
// received, in order.
type witness struct {
	mu      sync.Mutex
	got     []amqp.Delivery
	changed chan struct{}
}

func consumeAll(t *testing.T, queue string) *witness {
	t.Helper()
	c, err := amqp.DialConfig(rabbitURL(), amqp.Config{Properties: amqp.Table{"connection_name": "ackwise-outbox-witness"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(queue, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := &witness{changed: make(chan struct{}, 1)}
	go func() {
		for d := range ds {
			w.mu.Lock()
			w.got = append(w.got, d)
			w.mu.Unlock()
			select {
			case w.changed <- struct{}{}:
			default:
			}
		}
	}()
	return w
}

func (w *witness) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.got)
}

// waitFor waits until cond holds for the deliveries received so far.
func (w *witness) waitFor(t *testing.T, what string, cond func([]amqp.Delivery) bool) {
	t.Helper()
	timeout := time.After(outboxtest.Wait)
	for {
		w.mu.Lock()
		ok := cond(w.got)
		n := len(w.got)
		w.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-w.changed:
		case <-timeout:
			t.Fatalf("waiting for %s: %d messages received", what, n)
		}
	}
}

// TestRabbitMQOutage relays into the real RabbitMQ through a TCP proxy,
// cuts the proxy for brokerOutage while the application goes on adding
// rows, and checks that the backlog grows, drains after, and that every
// row reached the queue at least once, was marked sent once, and that
// each key's rows arrived in order.
func TestRabbitMQOutage(t *testing.T) {
	t.Parallel()
	q := rabbitQueue(t)
	b := setup(t, pgoutbox.Config{})
	u, err := url.Parse(rabbitURL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := tcpproxy.Start(t, u.Host)
	u.Host = proxy.Addr()
	w := consumeAll(t, q.Queue)

	const nkeys = 50
	next := 0 // the next row of each key
	var ids []string
	add := func() {
		msgs := make([]*ackwise.Message, nkeys)
		for k := range msgs {
			msgs[k] = outboxtest.Seq("k"+strconv.Itoa(k), next)
		}
		next++
		if err := b.add(t.Context(), true, msgs...); err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			ids = append(ids, m.ID)
		}
	}
	for range 20 {
		add()
	}

	sink, err := rabbitmq.NewSink(t.Context(), rabbitmq.SinkConfig{URL: u.String(), RoutingKey: q.Queue,
		ConnectionName: "ackwise-outbox-outage", ReconnectInitialInterval: 50 * time.Millisecond, ReconnectMaxInterval: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background()) //nolint:errcheck // a test's meter provider
	relay, err := outbox.NewRelay(b.store, sink, outbox.Config{
		Workers: 2, Lease: 10 * time.Second, PublishTimeout: 2 * time.Second, PollInterval: 100 * time.Millisecond,
		Publish:       producer.Config{Retry: retry.Policy{MaxAttempts: 2, InitialInterval: 50 * time.Millisecond, MaxInterval: 100 * time.Millisecond}},
		RowRetry:      retry.Policy{InitialInterval: 50 * time.Millisecond, MaxInterval: 500 * time.Millisecond},
		MeterProvider: mp,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	w.waitFor(t, "the first rows", func(d []amqp.Delivery) bool { return len(d) >= 100 })

	// The outage: the application goes on adding rows (a row of each key
	// every 250ms) and none reaches the broker.
	proxy.Cut()
	cutAt := time.Now()
	added := len(ids)
	settled := -1 // the witness's count once what was in flight at the cut arrived
	tick := time.NewTicker(250 * time.Millisecond)
	for time.Since(cutAt) < brokerOutage {
		<-tick.C
		add()
		if settled < 0 && time.Since(cutAt) > 5*time.Second {
			settled = w.count()
		}
	}
	tick.Stop()
	st, err := b.store.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := w.count(); got != settled {
		t.Fatalf("%d messages reached the queue during the outage: the proxy did not cut the broker off", got-settled)
	}
	if grown := len(ids) - added; st.Backlog < int64(grown) {
		t.Errorf("backlog %d at the end of the outage, want at least the %d rows added during it", st.Backlog, grown)
	}
	if st.Oldest.IsZero() || st.Oldest.After(cutAt) {
		t.Errorf("Stats.Oldest = %v: the backlog's oldest row must predate the cut at %v", st.Oldest, cutAt)
	}
	if n := outboxtest.Counter(t, reader, outbox.MetricPublishErrors); n == 0 {
		t.Errorf("%s = 0 after a %v outage", outbox.MetricPublishErrors, brokerOutage)
	}
	t.Logf("outage of %v: backlog %d rows, %d publish errors counted", brokerOutage, st.Backlog, outboxtest.Counter(t, reader, outbox.MetricPublishErrors))

	proxy.Restore()
	restoredAt := time.Now()
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	scanned := 0
	w.waitFor(t, "every row", func(ds []amqp.Delivery) bool {
		for _, d := range ds[scanned:] {
			id, _ := d.Headers[ackwise.HeaderEventID].(string)
			delete(want, id)
		}
		scanned = len(ds)
		return len(want) == 0
	})
	t.Logf("backlog drained %v after the broker came back", time.Since(restoredAt).Round(time.Millisecond))
	for {
		st, err := b.store.Stats(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if st.Backlog == 0 && st.Parked == 0 {
			break
		}
		if time.Since(restoredAt) > outboxtest.Wait {
			t.Fatalf("stats %+v: rows left unsent", st)
		}
		time.Sleep(20 * time.Millisecond) // polling the table: there is no signal to await
	}

	// Marked once: every row sent, each counted once by the relay.
	if n := b.count(t, `sent_at IS NOT NULL`); n != int64(len(ids)) {
		t.Errorf("%d rows marked sent, want %d", n, len(ids))
	}
	if n := outboxtest.Counter(t, reader, outbox.MetricPublished); n != int64(len(ids)) {
		t.Errorf("%s = %d, want %d: a row was marked sent twice", outbox.MetricPublished, n, len(ids))
	}
	// Per-key order at the consumer: a row may come twice (its confirm was
	// lost in the cut), but never after a later row of its key.
	w.mu.Lock()
	defer w.mu.Unlock()
	last := map[string]int{}
	dups := len(w.got) - len(ids)
	for _, d := range w.got {
		key, n, _ := strings.Cut(string(d.Body), "/")
		seq, err := strconv.Atoi(n)
		if err != nil || d.Headers[ackwise.HeaderKey] != key {
			t.Fatalf("unexpected message %q with key header %v", d.Body, d.Headers[ackwise.HeaderKey])
		}
		if prev, ok := last[key]; ok && seq < prev {
			t.Errorf("key %s: row %d arrived after row %d", key, seq, prev)
		}
		last[key] = seq
	}
	t.Logf("%d rows, %d messages received (%d duplicates from confirms lost in the cut)", len(ids), len(w.got), dups)
}
