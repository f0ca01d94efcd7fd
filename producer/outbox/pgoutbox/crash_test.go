package pgoutbox_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/rabbitmq"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/internal/crashtest"
	"github.com/ackwise/ackwise/internal/pgtest"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/pginbox"
	"github.com/ackwise/ackwise/producer/outbox"
	"github.com/ackwise/ackwise/producer/outbox/outboxtest"
	"github.com/ackwise/ackwise/producer/outbox/pgoutbox"
)

// The crash test runs a relay in a child process (this test binary
// re-executed) that is killed with SIGKILL after RabbitMQ confirmed a batch
// and before the relay marked its rows sent.

const (
	crashEnvTable = "ACKWISE_PGOUTBOX_CRASH_TABLE"
	crashEnvQueue = "ACKWISE_PGOUTBOX_CRASH_QUEUE"
	crashMarker   = "ACKWISE-OUTBOX-CONFIRMED"
	crashLease    = 2 * time.Second
)

// rabbitURL is the broker the tests talk to: ACKWISE_RABBITMQ_URL, else
// the local server.
func rabbitURL() string {
	if u := os.Getenv("ACKWISE_RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// rabbitQueue declares a fresh queue (and its dead-letter queue), deleted
// when the test ends; it fails the test when RabbitMQ cannot be reached.
func rabbitQueue(t *testing.T) rabbitmq.Config {
	t.Helper()
	if testing.Short() {
		t.Skip("needs RabbitMQ; -short runs offline tests only")
	}
	cfg := rabbitmq.Config{URL: rabbitURL(), Queue: randomName("ackwise-outbox-"), ConnectionName: "ackwise-outbox-test"}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := rabbitmq.Declare(ctx, cfg); err != nil {
		t.Fatalf("RabbitMQ at 127.0.0.1:5672 (start it with rabbitmq-server -detached): declare: %v", err)
	}
	t.Cleanup(func() {
		c, err := amqp.Dial(rabbitURL())
		if err != nil {
			t.Errorf("delete queues: %v", err)
			return
		}
		defer c.Close()
		ch, err := c.Channel()
		if err != nil {
			t.Errorf("delete queues: %v", err)
			return
		}
		for _, q := range []string{cfg.Queue, cfg.Queue + ".dlq"} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("delete queue %s: %v", q, err)
			}
		}
	})
	return cfg
}

// dieAfterConfirm is a sink that blocks for ever once the broker confirmed
// a batch, after telling the parent, which kills the process there.
type dieAfterConfirm struct{ adapters.Sink }

func (s dieAfterConfirm) Publish(ctx context.Context, msgs ...*ackwise.Message) error {
	err := s.Sink.Publish(ctx, msgs...)
	if err == nil {
		fmt.Println(crashMarker)
		select {}
	}
	return err
}

// TestCrashRelayChild is the child's body; it does nothing in a normal run.
func TestCrashRelayChild(t *testing.T) {
	table := os.Getenv(crashEnvTable)
	if table == "" {
		return
	}
	pool := pgtest.Connect(t, 4)
	store, err := pgoutbox.New(pool, pgoutbox.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	sink, err := rabbitmq.NewSink(t.Context(), rabbitmq.SinkConfig{URL: rabbitURL(), RoutingKey: os.Getenv(crashEnvQueue)})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(store, dieAfterConfirm{sink}, outbox.Config{Lease: crashLease, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_ = relay.Run(t.Context())
}

func TestCrashBetweenPublishAndMarkRepublishesSameIDs(t *testing.T) {
	t.Parallel()
	q := rabbitQueue(t)
	b := setup(t, pgoutbox.Config{})
	var ids []string
	for i := range 5 {
		m := &ackwise.Message{Key: fmt.Sprintf("customer-%d", i), Payload: fmt.Appendf(nil, "invoice %d paid", i)}
		if err := b.add(t.Context(), true, m); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
	}

	// The child publishes the five rows (one batch: five keys), RabbitMQ
	// confirms, and the child dies before marking them.
	crashtest.KillAt(t, "TestCrashRelayChild", crashMarker,
		crashEnvTable+"="+b.schema+".outbox", crashEnvQueue+"="+q.Queue, "ACKWISE_TEST_POSTGRES="+pgtest.URL())
	if n := b.count(t, `sent_at IS NULL AND claimed_by IS NOT NULL`); n != 5 {
		t.Fatalf("%d rows claimed and unsent after the crash, want 5 (confirmed but never marked)", n)
	}

	// A relay started after the crash takes the rows once the dead
	// relay's lease ran out and publishes them again, same event IDs.
	sink, err := rabbitmq.NewSink(t.Context(), rabbitmq.SinkConfig{URL: rabbitURL(), RoutingKey: q.Queue})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	relay, err := outbox.NewRelay(b.store, sink, outbox.Config{PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(t.Context())
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	deadline := time.Now().Add(outboxtest.Wait)
	for b.count(t, `sent_at IS NOT NULL`) != 5 {
		if time.Now().After(deadline) {
			t.Fatal("the rows of the dead relay were never published again")
		}
		time.Sleep(20 * time.Millisecond) // polling the table: there is no signal to await
	}
	rcancel()
	if err := <-relayDone; err != nil {
		t.Fatal(err)
	}

	// The consumer gets every event twice; its inbox applies each once.
	inboxStore, err := pginbox.New(b.pool, pginbox.Config{Table: b.schema + ".inbox", VersionTable: b.schema + ".versions"})
	if err != nil {
		t.Fatal(err)
	}
	if err := inboxStore.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	effects := pgx.Identifier{b.schema, "effects"}.Sanitize()
	if _, err := b.pool.Exec(t.Context(), `CREATE TABLE `+effects+` (event_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	delivered := map[string]int{}
	dups := 0
	all := make(chan struct{})
	inbox, err := middleware.Inbox(inboxStore, middleware.InboxConfig{Consumer: "billing",
		OnDuplicate: func(context.Context, *ackwise.Message) { mu.Lock(); dups++; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	src, err := rabbitmq.NewSource(t.Context(), q)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
		_, err := pginbox.Tx(ctx).Exec(ctx, `INSERT INTO `+effects+` (event_id) VALUES ($1)`, m.ID)
		return err
	})
	c, err := consumer.New(src, h, consumer.Config{Inbox: inbox, Observer: observerFunc(func(m *ackwise.Message, o consumer.Outcome) {
		if o != consumer.Acked {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		delivered[m.EventID()]++
		n := 0
		for _, k := range delivered {
			n += k
		}
		if n == 10 {
			close(all)
		}
	})})
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(t.Context())
	consumerDone := make(chan error, 1)
	go func() { consumerDone <- c.Run(cctx) }()
	select {
	case <-all:
	case <-time.After(outboxtest.Wait):
		mu.Lock()
		t.Fatalf("consumer acked %v, want each of the 5 events twice", delivered)
	}
	ccancel()
	if err := <-consumerDone; err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if delivered[id] != 2 {
			t.Errorf("event %s delivered %d times, want 2 (published before the crash and after)", id, delivered[id])
		}
		var n int
		if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM `+effects+` WHERE event_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("event %s applied %d times, want 1", id, n)
		}
	}
	if dups != 5 {
		t.Errorf("inbox absorbed %d duplicates, want 5", dups)
	}
}

type observerFunc func(*ackwise.Message, consumer.Outcome)

func (f observerFunc) Observe(m *ackwise.Message, o consumer.Outcome, _ time.Duration) { f(m, o) }
