// Command webhooks is the invoice-paid webhook service: marking an invoice
// paid and adding its "invoice.paid" event to the outbox commit in one
// transaction; a relay publishes the outbox to a queue keyed by customer;
// delivery workers POST each event to the customer's endpoint with an
// HMAC-SHA256 signature, retry timeouts, 5xx and 429 (honouring
// Retry-After) on a schedule of 1m, 5m, 30m, 2h and 12h, dead-letter other
// 4xx at once, and record each successful delivery by event ID so that a
// customer never gets one event twice.
//
// By default it runs on the in-memory broker and SQLite and needs no
// service:
//
//	go run ./examples/webhooks
//
// The same code runs on PostgreSQL and RabbitMQ or Kafka, given by URL:
//
//	go run ./examples/webhooks -db postgres://postgres@127.0.0.1:5432/test -broker amqp://guest:guest@127.0.0.1:5672 -schedule 1s,2s,5s
//	go run ./examples/webhooks -db postgres://… -broker kafka://127.0.0.1:9092 -schedule 1s,2s,5s
//
// -db puts the invoices, deliveries and outbox tables in -schema (created
// when missing); -broker declares -queue with a wait queue (RabbitMQ) or
// retry topic (Kafka) per delay of -schedule and a dead-letter queue or
// topic QUEUE.dlq. On a real broker the schedule runs in real time: give
// it short delays.
//
// The customers' endpoints are local httptest servers that misbehave, on a
// seed: some answer 503 a few times, some 429 with Retry-After, one times
// out once, one is gone (410), one is down for good. On the in-memory
// broker the retry schedule runs on a virtual clock, so a day of retries
// takes seconds, and the broker delivers every 9th message twice. It ends
// with one summary line:
//
//	invoices=N paid=P events=E delivered=D dead_lettered=X gone=G exhausted=Z retries=R duplicates=0 lost=0 bad_signatures=0 virtual=H
//
// lost counts paid invoices whose event neither reached the customer nor
// was dead-lettered: always 0. duplicates counts events a customer
// accepted more than once: 0, although brokers deliver some messages
// twice, because deliveries are recorded by event ID. virtual is the time
// the schedule took on the virtual clock (0 on a real broker).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/producer/outbox"
	"github.com/ackwise/ackwise/retry"
)

// Headers of a webhook request.
const (
	headerSignature = "Webhook-Signature" // sha256=<hex HMAC of "<timestamp>.<body>">
	headerTimestamp = "Webhook-Timestamp"
	headerEventID   = "Webhook-Event-Id"
)

// defaultSchedule is the retry schedule: attempt 1 fails, then these delays.
const defaultSchedule = "1m,5m,30m,2h,12h"

// event is the webhook's body.
type event struct {
	Type       string    `json:"type"`
	EventID    string    `json:"event_id"`
	InvoiceID  string    `json:"invoice_id"`
	CustomerID string    `json:"customer_id"`
	PaidAt     time.Time `json:"paid_at"`
}

func main() {
	var cfg config
	flag.IntVar(&cfg.invoices, "invoices", 300, "invoices to pay")
	flag.IntVar(&cfg.customers, "customers", 20, "customers, each with an endpoint")
	flag.Uint64Var(&cfg.seed, "seed", 1, "seed of the endpoints' behaviour")
	flag.DurationVar(&cfg.timeout, "timeout", 5*time.Second, "timeout of one webhook request")
	flag.StringVar(&cfg.db, "db", "", "PostgreSQL `URL` of the billing database (default: SQLite in a temporary file)")
	flag.StringVar(&cfg.schema, "schema", "webhooks", "PostgreSQL `schema` of the tables, with -db")
	flag.StringVar(&cfg.broker, "broker", "", "broker `URL` without a path, amqp:// or kafka:// (default: the in-memory broker)")
	flag.StringVar(&cfg.queue, "queue", "invoice-paid", "`queue` or topic of the events")
	schedule := flag.String("schedule", defaultSchedule, "retry `delays`, comma-separated")
	flag.Parse()
	var err error
	if cfg.schedule, err = parseSchedule(*schedule); err != nil {
		fmt.Fprintln(os.Stderr, "webhooks: -schedule:", err)
		os.Exit(2)
	}
	sum, err := run(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "webhooks:", err)
		os.Exit(1)
	}
	fmt.Println(sum)
	if sum.lost != 0 || sum.duplicates != 0 || sum.badSignatures != 0 {
		os.Exit(1)
	}
}

func parseSchedule(s string) ([]time.Duration, error) {
	var ds []time.Duration
	for f := range strings.SplitSeq(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		ds = append(ds, d)
	}
	return ds, nil
}

type config struct {
	invoices, customers int
	seed                uint64
	timeout             time.Duration
	db, schema          string
	broker, queue       string
	schedule            []time.Duration
}

type summary struct {
	invoices, paid, events, delivered, deadLettered, gone, exhausted, retries, duplicates, lost, badSignatures int
	virtual                                                                                                    time.Duration
}

func (s summary) String() string {
	return fmt.Sprintf("invoices=%d paid=%d events=%d delivered=%d dead_lettered=%d gone=%d exhausted=%d retries=%d duplicates=%d lost=%d bad_signatures=%d virtual=%s",
		s.invoices, s.paid, s.events, s.delivered, s.deadLettered, s.gone, s.exhausted, s.retries, s.duplicates, s.lost, s.badSignatures, s.virtual.Round(time.Minute))
}

func run(ctx context.Context, cfg config) (summary, error) {
	if cfg.invoices < 1 || cfg.customers < 6 || cfg.timeout <= 0 || len(cfg.schedule) == 0 {
		return summary{}, fmt.Errorf("want invoices ≥ 1, customers ≥ 6, a positive timeout and a schedule; got %d, %d, %v, %v", cfg.invoices, cfg.customers, cfg.timeout, cfg.schedule)
	}
	if cfg.queue == "" {
		cfg.queue = "invoice-paid"
	}
	app, err := openBilling(ctx, cfg.db, cfg.schema)
	if err != nil {
		return summary{}, err
	}
	defer app.close()

	// The customers' endpoints.
	secret := []byte("whsec-example")
	eps := newEndpoints(cfg.customers, cfg.seed, secret)
	defer eps.close()

	// Pay the invoices: every 13th card is declined and its transaction
	// rolls back, leaving no event. Invoice IDs are this run's own, so a
	// database may serve many runs.
	runID := newRunID()
	sum := summary{invoices: cfg.invoices}
	var eventIDs []string
	for i := range cfg.invoices {
		customer := fmt.Sprintf("cust-%02d", i%cfg.customers)
		id, err := app.pay(ctx, fmt.Sprintf("inv-%s-%05d", runID, i), customer, i%13 == 12)
		if err != nil {
			return summary{}, err
		}
		if id != "" {
			sum.paid++
			eventIDs = append(eventIDs, id)
		}
	}

	tr, err := openTransport(ctx, cfg.broker, cfg.queue, cfg.schedule)
	if err != nil {
		return summary{}, err
	}
	defer tr.close()

	// The relay: outbox → queue, keyed by customer.
	relay, err := outbox.NewRelay(app.outbox, tr.sink, outbox.Config{PollInterval: 20 * time.Millisecond})
	if err != nil {
		return summary{}, err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()

	// The delivery workers.
	deliverer := &deliverer{bill: app, client: &http.Client{}, eps: eps, secret: secret, timeout: cfg.timeout, clock: tr.clock,
		perCustomer: map[string]chan struct{}{}, sending: map[string]*eventLock{}}
	settled := newOutcomes(len(eventIDs))
	c, err := consumer.New(tr.src, ackwise.HandlerFunc(deliverer.deliver), consumer.Config{
		Name:        "webhooks",
		Concurrency: 8,
		// Webhooks of one customer need no order (each carries its event
		// ID and time); the per-customer limit is the deliverer's.
		Ordering:  consumer.OrderNone,
		Retry:     retry.Policy{MaxAttempts: len(cfg.schedule) + 1, Tiers: cfg.schedule},
		RetryMode: consumer.RetryBroker,
		Clock:     tr.clock,
		Observer:  settled,
	})
	if err != nil {
		return summary{}, err
	}
	runCtx, stopConsumer := context.WithCancel(ctx)
	defer stopConsumer()
	consumerDone := make(chan error, 1)
	go func() { consumerDone <- c.Run(runCtx) }()

	// Wait until every event was settled: delivered, or dead-lettered.
	start := tr.clock.Now()
	var total time.Duration
	for _, d := range cfg.schedule {
		total += d
	}
	limit := 2*time.Minute + 2*total
	if err := tr.waitSettled(ctx, settled, cfg.queue, len(eventIDs), limit); err != nil {
		return summary{}, err
	}
	stopRelay()
	stopConsumer()
	if err := errors.Join(<-relayDone, <-consumerDone); err != nil {
		return summary{}, err
	}
	if tr.vclock != nil {
		sum.virtual = tr.clock.Now().Sub(start)
	}

	// Count.
	sum.events = len(eventIDs)
	dead, err := tr.deadLetters(ctx, settled.deadLettered(), time.Minute)
	if err != nil {
		return summary{}, err
	}
	for _, env := range dead {
		switch env.Reason {
		case dlq.ReasonPermanent:
			sum.gone++
		case dlq.ReasonMaxAttempts:
			sum.exhausted++
		}
	}
	sum.deadLettered = len(dead)
	accepted, bad := eps.results()
	sum.badSignatures = bad
	for _, id := range eventIDs {
		n := accepted[id]
		if n > 0 {
			sum.delivered++
		}
		if n > 1 {
			sum.duplicates += n - 1
		}
		if _, isDead := dead[id]; n == 0 && !isDead {
			sum.lost++
		}
	}
	sum.retries = deliverer.retries()
	return sum, nil
}

// newRunID returns a random name for this run.
func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
