// Command checkout runs orders through a queue to a "charge the card"
// handler while the consumer is crashed at the worst moment — after the card
// was charged, before the ack — and a few orders carry poison payloads.
//
// It runs on the in-memory broker and needs no service:
//
//	go run ./examples/checkout
//
// It ends with one summary line:
//
//	orders=N effects=E lost=0 duplicates=D dead_lettered=P crashes=C
//
// lost counts orders that were neither charged nor dead-lettered: it is
// always 0, because ackwise acks only after the work. duplicates counts
// charges beyond the first for one order: a crash between the charge and the
// ack makes the broker redeliver an order that was already charged. The
// idempotency inbox (on SQLite, committed in the same transaction as the
// charge) turns those redeliveries into no-ops, so duplicates is 0; run with
// -inbox=false to see them.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/sqliteinbox"
	"github.com/ackwise/ackwise/retry"
)

type order struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Cents    int    `json:"cents"`
}

// ledger is the card processor's book: one row per charge, in SQLite. With
// the inbox, a charge and its inbox record commit in one transaction.
type ledger struct {
	db *sql.DB
}

func (l *ledger) charge(ctx context.Context, o order, inbox bool) error {
	const q = `INSERT INTO charges (order_id, cents) VALUES (?, ?)`
	if inbox {
		_, err := sqliteinbox.Tx(ctx).ExecContext(ctx, q, o.ID, o.Cents)
		return err
	}
	_, err := l.db.ExecContext(ctx, q, o.ID, o.Cents)
	return err
}

// charges returns the number of charges per order.
func (l *ledger) charges(ctx context.Context) (map[string]int, error) {
	rows, err := l.db.QueryContext(ctx, `SELECT order_id, COUNT(*) FROM charges GROUP BY order_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}

func main() {
	orders := flag.Int("orders", 500, "orders to publish")
	poison := flag.Int("poison", 5, "orders with an undecodable payload")
	crashEvery := flag.Int("crash-every", 40, "crash the consumer before the ack of every n-th charged order")
	useInbox := flag.Bool("inbox", true, "deduplicate with the SQLite idempotency inbox")
	verbose := flag.Bool("v", false, "log what the engine does")
	flag.Parse()
	sum, err := run(*orders, *poison, *crashEvery, *useInbox, *verbose)
	if err != nil {
		fmt.Fprintln(os.Stderr, "checkout:", err)
		os.Exit(1)
	}
	fmt.Println(sum)
	if sum.lost != 0 {
		os.Exit(1)
	}
}

// summary is the example's outcome.
type summary struct {
	orders, effects, lost, duplicates, deadLettered, crashes int
}

func (s summary) String() string {
	return fmt.Sprintf("orders=%d effects=%d lost=%d duplicates=%d dead_lettered=%d crashes=%d",
		s.orders, s.effects, s.lost, s.duplicates, s.deadLettered, s.crashes)
}

func run(n, poison, crashEvery int, useInbox, verbose bool) (summary, error) {
	if n < 1 || poison < 0 || poison > n || crashEvery < 1 {
		return summary{}, fmt.Errorf("want orders ≥ 1, 0 ≤ poison ≤ orders, crash-every ≥ 1; got %d, %d, %d", n, poison, crashEvery)
	}
	ctx := context.Background()
	logger := slog.New(slog.DiscardHandler)
	if verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}

	broker, err := memory.New(memory.Config{})
	if err != nil {
		return summary{}, err
	}
	// A short lease, so that a crashed consumer's orders come back quickly.
	if err := broker.CreateQueue("orders", memory.QueueConfig{Lease: 200 * time.Millisecond}); err != nil {
		return summary{}, err
	}

	// Publish the orders; every poison-th one is garbage.
	sink, err := broker.Sink("orders")
	if err != nil {
		return summary{}, err
	}
	poisoned := map[string]bool{}
	for i := range n {
		o := order{ID: fmt.Sprintf("order-%04d", i), Customer: fmt.Sprintf("cust-%d", i%37), Cents: 100 + i}
		payload, _ := json.Marshal(o)
		if poison > 0 && i%(n/poison) == n/poison-1 && len(poisoned) < poison {
			payload = []byte(`{"id": "` + o.ID + `", "cents": "lots"`)
			poisoned[o.ID] = true
		}
		if err := sink.Publish(ctx, &ackwise.Message{ID: o.ID, Key: o.Customer, Payload: payload}); err != nil {
			return summary{}, fmt.Errorf("publish %s: %w", o.ID, err)
		}
	}

	// Crash the consumer after every crashEvery-th charge, before its ack.
	if _, err := broker.InjectFault("orders", memory.Fault{Kind: memory.FaultCrashBeforeAck, Every: crashEvery}); err != nil {
		return summary{}, err
	}

	dir, err := os.MkdirTemp("", "checkout-")
	if err != nil {
		return summary{}, err
	}
	defer os.RemoveAll(dir)
	db, err := sqliteinbox.Open(dir + "/checkout.db")
	if err != nil {
		return summary{}, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE charges (order_id TEXT NOT NULL, cents INTEGER NOT NULL)`); err != nil {
		return summary{}, err
	}
	cards := &ledger{db: db}
	var inbox ackwise.Middleware
	if useInbox {
		store, err := sqliteinbox.New(db, sqliteinbox.Config{})
		if err != nil {
			return summary{}, err
		}
		if err := store.Migrate(ctx); err != nil {
			return summary{}, err
		}
		if inbox, err = middleware.Inbox(store, middleware.InboxConfig{Consumer: "checkout"}); err != nil {
			return summary{}, err
		}
	}
	handler := ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		var o order
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return ackwise.Permanent(fmt.Errorf("decode order: %w", err))
		}
		return cards.charge(ctx, o, useInbox)
	})

	// Run consumers until every order is settled; each crash ends one
	// consumer, and a new one takes over, as a restarted process would.
	crashes := 0
	deadline := time.Now().Add(time.Minute)
	for {
		settled, err := settledOrders(broker)
		if err != nil {
			return summary{}, err
		}
		if settled == n {
			break
		}
		if time.Now().After(deadline) {
			return summary{}, fmt.Errorf("only %d of %d orders settled after a minute", settled, n)
		}
		src, err := broker.QueueSource("orders")
		if err != nil {
			return summary{}, err
		}
		c, err := consumer.New(src, handler, consumer.Config{
			Name:        "checkout",
			Concurrency: 8,
			Retry:       retry.Policy{MaxAttempts: 3, InitialInterval: 10 * time.Millisecond},
			Inbox:       inbox,
			Logger:      logger,
		})
		if err != nil {
			return summary{}, err
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(runCtx) }()
		// Stop this consumer when it crashed or when all orders are settled.
		crashed, err := waitCrashOrDone(ctx, broker, src.ID(), n)
		cancel()
		if runErr := <-done; err == nil && runErr != nil && !errors.Is(runErr, memory.ErrCrashed) {
			err = runErr
		}
		_ = src.Close()
		if err != nil {
			return summary{}, err
		}
		if crashed {
			crashes++
		}
	}

	dead, err := broker.Messages("orders.dlq")
	if err != nil {
		return summary{}, err
	}
	deadIDs := map[string]bool{}
	for _, m := range dead {
		env, err := dlq.Decode(m.Headers)
		if err != nil {
			return summary{}, fmt.Errorf("dead letter %s: %w", m.ID, err)
		}
		if env.Reason != dlq.ReasonPermanent || !poisoned[m.ID] {
			return summary{}, fmt.Errorf("dead letter %s: reason %s, poisoned %v", m.ID, env.Reason, poisoned[m.ID])
		}
		deadIDs[m.ID] = true
	}
	charges, err := cards.charges(ctx)
	if err != nil {
		return summary{}, err
	}
	effects, duplicates, lost := 0, 0, 0
	for i := range n {
		id := fmt.Sprintf("order-%04d", i)
		c := charges[id]
		effects += c
		if c > 1 {
			duplicates += c - 1
		}
		if c == 0 && !deadIDs[id] {
			lost++
		}
	}
	return summary{orders: n, effects: effects, lost: lost, duplicates: duplicates, deadLettered: len(deadIDs), crashes: crashes}, nil
}

// settledOrders counts the orders acked or dead-lettered so far.
func settledOrders(b *memory.Broker) (int, error) {
	events, err := b.History("orders")
	if err != nil {
		return 0, err
	}
	settled := map[string]bool{}
	for _, e := range events {
		if e.Kind == memory.EventAcked || e.Kind == memory.EventDeadLettered {
			settled[e.ID] = true
		}
	}
	return len(settled), nil
}

// waitCrashOrDone waits until the consumer source id crashed or all n orders
// are settled, woken by the broker's history (no polling).
func waitCrashOrDone(ctx context.Context, b *memory.Broker, id string, n int) (crashed bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	settled := map[string]bool{}
	seen := 0
	err = b.WaitHistory(ctx, "orders", func(events []memory.Event) bool {
		for _, e := range events[seen:] {
			switch {
			case e.Kind == memory.EventCrashed && e.Consumer == id:
				crashed = true
			case e.Kind == memory.EventAcked || e.Kind == memory.EventDeadLettered:
				settled[e.ID] = true
			}
		}
		seen = len(events)
		return crashed || len(settled) == n
	})
	return crashed, err
}
