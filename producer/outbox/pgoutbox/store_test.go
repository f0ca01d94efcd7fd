package pgoutbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/internal/pgtest"
	"github.com/ackwise/ackwise/producer/outbox"
	"github.com/ackwise/ackwise/producer/outbox/outboxtest"
	"github.com/ackwise/ackwise/producer/outbox/pgoutbox"
)

func TestNewValidatesTable(t *testing.T) {
	t.Parallel()
	pool := pgtest.Connect(t, 1)
	for _, table := range []string{"a.b.c", "bad-name", `x"y`, strings.Repeat("t", 47)} {
		if _, err := pgoutbox.New(pool, pgoutbox.Config{Table: table}); err == nil || !strings.Contains(err.Error(), "Config.Table") {
			t.Errorf("New(Table %q) = %v, want an error naming Config.Table", table, err)
		}
	}
	if _, err := pgoutbox.New(nil, pgoutbox.Config{}); err == nil {
		t.Error("New(nil pool) did not fail")
	}
}

func TestMigrateTwiceAndConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t, pgoutbox.Config{})
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- b.store.Migrate(t.Context()) }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// With a poll interval of an hour, only the trigger's NOTIFY can wake the
// relay in time.
func TestNotifyWakesRelay(t *testing.T) {
	t.Parallel()
	b := setup(t, pgoutbox.Config{})
	broker, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sink, err := broker.Sink("q")
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(b.store, sink, outbox.Config{PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for i := range 3 {
		m := &ackwise.Message{Key: "k", Payload: []byte("x")}
		if err := b.add(t.Context(), true, m); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(t.Context(), outboxtest.Wait)
		err := broker.WaitHistory(wctx, "q", func(ev []memory.Event) bool {
			n := 0
			for _, e := range ev {
				if e.Kind == memory.EventPublished {
					n++
				}
			}
			return n == i+1
		})
		wcancel()
		if err != nil {
			t.Fatalf("row %d not relayed without polling: %v", i, err)
		}
	}
}

func TestUnparkRelaysParkedRow(t *testing.T) {
	t.Parallel()
	b := setup(t, pgoutbox.Config{})
	bundle := outboxtest.NewBundle(t, outboxtest.Harness{New: func(*testing.T) *outboxtest.Backend {
		return &outboxtest.Backend{Store: b.store, Add: b.add}
	}})
	poison := &ackwise.Message{Key: "k", Payload: []byte("refused once")}
	if err := b.add(t.Context(), true, poison); err != nil {
		t.Fatal(err)
	}
	if _, err := bundle.Broker.InjectFault(bundle.Queue, memory.Fault{Kind: memory.FaultFailPublish, Count: 1,
		Err: ackwise.Permanent(errors.New("message refused"))}); err != nil {
		t.Fatal(err)
	}
	bundle.StartRelay(t, bundle.FastConfig())
	bundle.WaitStats(t, "a parked row", func(s outbox.Stats) bool { return s.Parked == 1 })
	if n := b.count(t, `parked_at IS NOT NULL AND last_error LIKE '%permanent%'`); n != 1 {
		t.Fatalf("%d parked rows with the error recorded, want 1", n)
	}
	var id int64
	if err := b.pool.QueryRow(t.Context(), `SELECT id FROM `+b.schema+`.outbox`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if n, err := b.store.Unpark(t.Context(), id); err != nil || n != 1 {
		t.Fatalf("Unpark = %d, %v", n, err)
	}
	msgs := bundle.WaitPublished(t, 1)
	if msgs[0].EventID() != poison.ID {
		t.Fatalf("published %s, want the unparked %s", msgs[0].EventID(), poison.ID)
	}
}
