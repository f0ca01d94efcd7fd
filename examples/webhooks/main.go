// Command webhooks is the invoice-paid webhook service: marking an invoice
// paid and adding its "invoice.paid" event to the outbox commit in one
// transaction; a relay publishes the outbox to a queue keyed by customer;
// delivery workers POST each event to the customer's endpoint with an
// HMAC-SHA256 signature, retry timeouts, 5xx and 429 (honouring
// Retry-After) on a schedule of 1m, 5m, 30m, 2h and 12h, dead-letter other
// 4xx at once, and record each successful delivery by event ID so that a
// customer never gets one event twice.
//
// It runs on the in-memory broker and SQLite and needs no service:
//
//	go run ./examples/webhooks
//
// The customers' endpoints are local httptest servers that misbehave, on a
// seed: some answer 503 a few times, some 429 with Retry-After, one times
// out once, one is gone (410), one is down for good. The retry schedule runs
// on a virtual clock, so a day of retries takes seconds. It ends with one
// summary line:
//
//	invoices=N paid=P events=E delivered=D dead_lettered=X gone=G exhausted=Z retries=R duplicates=0 lost=0 bad_signatures=0 virtual=H
//
// lost counts paid invoices whose event neither reached the customer nor
// was dead-lettered: always 0. duplicates counts events a customer
// accepted more than once: 0, although the broker here delivers some
// messages twice, because deliveries are recorded by event ID.
package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/middleware/sqliteinbox"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/producer/outbox"
	"github.com/ackwise/ackwise/producer/outbox/sqliteoutbox"
	"github.com/ackwise/ackwise/retry"
)

// Headers of a webhook request.
const (
	headerSignature = "Webhook-Signature" // sha256=<hex HMAC of "<timestamp>.<body>">
	headerTimestamp = "Webhook-Timestamp"
	headerEventID   = "Webhook-Event-Id"
	queue           = "invoice-paid"
)

// schedule is the retry schedule: attempt 1 fails, then these delays.
var schedule = []time.Duration{time.Minute, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 12 * time.Hour}

// event is the webhook's body.
type event struct {
	Type       string    `json:"type"`
	EventID    string    `json:"event_id"`
	InvoiceID  string    `json:"invoice_id"`
	CustomerID string    `json:"customer_id"`
	PaidAt     time.Time `json:"paid_at"`
}

func main() {
	invoices := flag.Int("invoices", 300, "invoices to pay")
	customers := flag.Int("customers", 20, "customers, each with an endpoint")
	seed := flag.Uint64("seed", 1, "seed of the endpoints' behaviour")
	timeout := flag.Duration("timeout", 5*time.Second, "timeout of one webhook request")
	flag.Parse()
	sum, err := run(config{invoices: *invoices, customers: *customers, seed: *seed, timeout: *timeout})
	if err != nil {
		fmt.Fprintln(os.Stderr, "webhooks:", err)
		os.Exit(1)
	}
	fmt.Println(sum)
	if sum.lost != 0 || sum.duplicates != 0 || sum.badSignatures != 0 {
		os.Exit(1)
	}
}

type config struct {
	invoices, customers int
	seed                uint64
	timeout             time.Duration
}

type summary struct {
	invoices, paid, events, delivered, deadLettered, gone, exhausted, retries, duplicates, lost, badSignatures int
	virtual                                                                                                    time.Duration
}

func (s summary) String() string {
	return fmt.Sprintf("invoices=%d paid=%d events=%d delivered=%d dead_lettered=%d gone=%d exhausted=%d retries=%d duplicates=%d lost=%d bad_signatures=%d virtual=%s",
		s.invoices, s.paid, s.events, s.delivered, s.deadLettered, s.gone, s.exhausted, s.retries, s.duplicates, s.lost, s.badSignatures, s.virtual.Round(time.Minute))
}

func run(cfg config) (summary, error) {
	if cfg.invoices < 1 || cfg.customers < 6 || cfg.timeout <= 0 {
		return summary{}, fmt.Errorf("want invoices ≥ 1, customers ≥ 6 and a positive timeout; got %d, %d, %v", cfg.invoices, cfg.customers, cfg.timeout)
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "webhooks-")
	if err != nil {
		return summary{}, err
	}
	defer os.RemoveAll(dir)
	db, err := sqliteinbox.Open(filepath.Join(dir, "billing.db"))
	if err != nil {
		return summary{}, err
	}
	defer db.Close()
	app, err := newBilling(ctx, db)
	if err != nil {
		return summary{}, err
	}

	// The customers' endpoints.
	secret := []byte("whsec-example")
	eps := newEndpoints(cfg.customers, cfg.seed, secret)
	defer eps.close()

	// Pay the invoices: every 13th card is declined and its transaction
	// rolls back, leaving no event.
	sum := summary{invoices: cfg.invoices}
	var eventIDs []string
	for i := range cfg.invoices {
		customer := fmt.Sprintf("cust-%02d", i%cfg.customers)
		id, err := app.pay(ctx, fmt.Sprintf("inv-%05d", i), customer, i%13 == 12)
		if err != nil {
			return summary{}, err
		}
		if id != "" {
			sum.paid++
			eventIDs = append(eventIDs, id)
		}
	}

	// The relay: outbox → queue, keyed by customer.
	clock := memory.NewVirtualClock(time.Time{})
	broker, err := memory.New(memory.Config{Clock: clock})
	if err != nil {
		return summary{}, err
	}
	if err := broker.CreateQueue(queue, memory.QueueConfig{Lease: time.Hour}); err != nil {
		return summary{}, err
	}
	sink, err := broker.Sink(queue)
	if err != nil {
		return summary{}, err
	}
	relay, err := outbox.NewRelay(app.outbox, sink, outbox.Config{PollInterval: 20 * time.Millisecond})
	if err != nil {
		return summary{}, err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	// The broker delivers every 9th message twice, as any broker may.
	if _, err := broker.InjectFault(queue, memory.Fault{Kind: memory.FaultDuplicate, Every: 9}); err != nil {
		return summary{}, err
	}

	// The delivery workers.
	deliverer := &deliverer{db: db, client: &http.Client{}, eps: eps, secret: secret, timeout: cfg.timeout, clock: clock,
		perCustomer: map[string]chan struct{}{}, sending: map[string]*eventLock{}}
	src, err := broker.QueueSource(queue)
	if err != nil {
		return summary{}, err
	}
	c, err := consumer.New(src, ackwise.HandlerFunc(deliverer.deliver), consumer.Config{
		Name:        "webhooks",
		Concurrency: 8,
		// Webhooks of one customer need no order (each carries its event
		// ID and time); the per-customer limit is the deliverer's.
		Ordering:  consumer.OrderNone,
		Retry:     retry.Policy{MaxAttempts: len(schedule) + 1, Tiers: schedule},
		RetryMode: consumer.RetryBroker,
		Clock:     clock,
	})
	if err != nil {
		return summary{}, err
	}
	runCtx, stopConsumer := context.WithCancel(ctx)
	defer stopConsumer()
	consumerDone := make(chan error, 1)
	go func() { consumerDone <- c.Run(runCtx) }()

	// Wait until every event was published, then drive the virtual clock
	// whenever the workers are idle, until every message is settled.
	start := clock.Now()
	if err := waitIdle(broker, len(eventIDs), 5*time.Minute, clock, start); err != nil {
		return summary{}, err
	}
	stopRelay()
	stopConsumer()
	if err := errors.Join(<-relayDone, <-consumerDone); err != nil {
		return summary{}, err
	}
	sum.virtual = clock.Now().Sub(start)

	// Count.
	sum.events = len(eventIDs)
	dead, err := broker.Messages(queue + ".dlq")
	if err != nil {
		return summary{}, err
	}
	deadIDs := map[string]bool{}
	for _, m := range dead {
		env, err := dlq.Decode(m.Headers)
		if err != nil {
			return summary{}, err
		}
		deadIDs[m.EventID()] = true
		switch env.Reason {
		case dlq.ReasonPermanent:
			sum.gone++
		case dlq.ReasonMaxAttempts:
			sum.exhausted++
		}
	}
	sum.deadLettered = len(deadIDs)
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
		if n == 0 && !deadIDs[id] {
			sum.lost++
		}
	}
	sum.retries = deliverer.retries()
	return sum, nil
}

// waitIdle waits until events messages were published and every one is
// settled (acked or dead-lettered), advancing the clock by step each time
// nothing is ready or in flight.
func waitIdle(b *memory.Broker, events int, step time.Duration, clock *memory.VirtualClock, start time.Time) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := b.Stats(queue)
		if err != nil {
			return err
		}
		settled := int(st.Acked + st.DeadLettered)
		if st.Published >= int64(events) && st.Ready == 0 && st.InFlight == 0 {
			if st.Delayed == 0 && settled >= int(st.Published) {
				return nil
			}
			if clock.Now().Sub(start) > 48*time.Hour {
				return fmt.Errorf("messages still delayed after two virtual days: %+v", st)
			}
			clock.Advance(step)
			continue
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not settled after two minutes: %+v", st)
		}
		time.Sleep(2 * time.Millisecond) // the workers run in real time: poll the broker's counts
	}
}

// billing is the application: invoices, and the outbox in the same file.
type billing struct {
	db     *sql.DB
	outbox *sqliteoutbox.Store
}

func newBilling(ctx context.Context, db *sql.DB) (*billing, error) {
	ob, err := sqliteoutbox.New(db, sqliteoutbox.Config{})
	if err != nil {
		return nil, err
	}
	if err := ob.Migrate(ctx); err != nil {
		return nil, err
	}
	_, err = db.ExecContext(ctx, `CREATE TABLE invoices (id TEXT PRIMARY KEY, customer TEXT NOT NULL, status TEXT NOT NULL);
CREATE TABLE deliveries (event_id TEXT PRIMARY KEY, customer TEXT NOT NULL, delivered_at INTEGER NOT NULL)`)
	if err != nil {
		return nil, err
	}
	return &billing{db: db, outbox: ob}, nil
}

// pay marks the invoice paid and adds its event to the outbox, in one
// transaction; a declined card rolls both back. It returns the event ID,
// or "" when the payment was declined.
func (b *billing) pay(ctx context.Context, invoice, customer string, declined bool) (string, error) {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.ExecContext(ctx, `INSERT INTO invoices (id, customer, status) VALUES (?, ?, 'paid')`, invoice, customer); err != nil {
		return "", err
	}
	msg := &ackwise.Message{Key: customer}
	ev := event{Type: "invoice.paid", InvoiceID: invoice, CustomerID: customer, PaidAt: time.Now().UTC()}
	// The event ID goes into the body too, so it is made here rather
	// than by Add.
	msg.ID = producer.NewEventID()
	ev.EventID = msg.ID
	if msg.Payload, err = json.Marshal(ev); err != nil {
		return "", err
	}
	if err := b.outbox.Add(ctx, tx, msg); err != nil {
		return "", err
	}
	if declined {
		return "", tx.Rollback()
	}
	return msg.ID, tx.Commit()
}

// deliverer POSTs events to the customers' endpoints.
type deliverer struct {
	db      *sql.DB
	client  *http.Client
	eps     *endpoints
	secret  []byte
	timeout time.Duration
	clock   ackwise.Clock

	mu          sync.Mutex
	tries       int
	perCustomer map[string]chan struct{} // a bulkhead per customer
	sending     map[string]*eventLock    // by event ID
}

// eventLock serializes the deliveries of one event: a broker may hand the
// same message to two workers at once, and the second must find the
// first's record. (Several processes would take a row lock instead.)
type eventLock struct {
	mu   sync.Mutex
	refs int
}

// lockEvent locks id and returns its unlock.
func (d *deliverer) lockEvent(id string) func() {
	d.mu.Lock()
	l := d.sending[id]
	if l == nil {
		l = &eventLock{}
		d.sending[id] = l
	}
	l.refs++
	d.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		d.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(d.sending, id)
		}
		d.mu.Unlock()
	}
}

// maxPerCustomer is how many requests one customer's endpoint gets at once:
// a slow endpoint holds at most this many of the workers.
const maxPerCustomer = 2

// slot takes one of customer's places, waiting for one to be free; release
// gives it back.
func (d *deliverer) slot(ctx context.Context, customer string) (release func(), err error) {
	d.mu.Lock()
	sem := d.perCustomer[customer]
	if sem == nil {
		sem = make(chan struct{}, maxPerCustomer)
		d.perCustomer[customer] = sem
	}
	d.mu.Unlock()
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (d *deliverer) retries() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tries
}

// deliver is the handler: skip an event already delivered, POST it signed,
// and classify the answer.
func (d *deliverer) deliver(ctx context.Context, msg *ackwise.Message) error {
	defer d.lockEvent(msg.ID)()
	var done bool
	if err := d.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM deliveries WHERE event_id = ?)`, msg.ID).Scan(&done); err != nil {
		return err
	}
	if done {
		return nil // the customer has it: a redelivery, or the relay's republish
	}
	release, err := d.slot(ctx, msg.Key)
	if err != nil {
		return err
	}
	defer release()
	if msg.Attempt > 1 {
		d.mu.Lock()
		d.tries++
		d.mu.Unlock()
	}
	ts := strconv.FormatInt(d.clock.Now().Unix(), 10)
	mac := hmac.New(sha256.New, d.secret)
	mac.Write([]byte(ts + "."))
	mac.Write(msg.Payload)
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, d.eps.url(msg.Key), bytes.NewReader(msg.Payload))
	if err != nil {
		return ackwise.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(headerSignature, "sha256="+hex.EncodeToString(mac.Sum(nil)))
	req.Header.Set(headerTimestamp, ts)
	req.Header.Set(headerEventID, msg.ID)
	resp, err := d.client.Do(req)
	if err != nil {
		return fmt.Errorf("POST to %s: %w", msg.Key, err) // a timeout or a refused connection: retried
	}
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		_, err := d.db.ExecContext(ctx, `INSERT INTO deliveries (event_id, customer, delivered_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING`,
			msg.ID, msg.Key, d.clock.Now().UnixMilli())
		return err
	case resp.StatusCode == http.StatusTooManyRequests:
		err := fmt.Errorf("POST to %s: %s", msg.Key, resp.Status)
		if s, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && s > 0 {
			return ackwise.RetryAfter(err, time.Duration(s)*time.Second)
		}
		return err
	case resp.StatusCode >= 500:
		return fmt.Errorf("POST to %s: %s", msg.Key, resp.Status)
	default: // any other 4xx: the request itself is wrong; retrying cannot help
		return ackwise.Permanent(fmt.Errorf("POST to %s: %s", msg.Key, resp.Status))
	}
}

// behaviour is how a customer's endpoint answers.
type behaviour int

const (
	healthy     behaviour = iota
	flaky                 // 503 on the first two tries of each event
	rateLimited           // 429 with Retry-After: 900 on the first try of each event
	slowOnce              // its first request ever hangs past the timeout
	gone                  // 410 Gone: the customer removed the endpoint
	down                  // 503 for ever
)

// endpoints are the customers' webhook receivers.
type endpoints struct {
	secret  []byte
	servers map[string]*httptest.Server

	mu       sync.Mutex
	behave   map[string]behaviour
	tries    map[string]int // by event ID
	accepted map[string]int // by event ID: 2xx answers
	hung     map[string]bool
	bad      int
}

func newEndpoints(n int, seed uint64, secret []byte) *endpoints {
	e := &endpoints{secret: secret, servers: map[string]*httptest.Server{}, behave: map[string]behaviour{},
		tries: map[string]int{}, accepted: map[string]int{}, hung: map[string]bool{}}
	rnd := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	kinds := []behaviour{gone, down, slowOnce, rateLimited, flaky, flaky}
	for i := range n {
		customer := fmt.Sprintf("cust-%02d", i)
		b := healthy
		if i < len(kinds) {
			b = kinds[i]
		} else if rnd.IntN(3) == 0 {
			b = []behaviour{flaky, rateLimited}[rnd.IntN(2)]
		}
		e.behave[customer] = b
		e.servers[customer] = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { e.serve(customer, w, r) }))
	}
	return e
}

func (e *endpoints) url(customer string) string { return e.servers[customer].URL + "/hooks" }

func (e *endpoints) close() {
	for _, s := range e.servers {
		s.CloseClientConnections()
		s.Close()
	}
}

// serve is a customer's receiver: it verifies the signature, then answers
// as its behaviour says.
func (e *endpoints) serve(customer string, w http.ResponseWriter, r *http.Request) {
	var body bytes.Buffer
	_, _ = body.ReadFrom(r.Body)
	mac := hmac.New(sha256.New, e.secret)
	mac.Write([]byte(r.Header.Get(headerTimestamp) + "."))
	mac.Write(body.Bytes())
	want := "sha256=" + hex.EncodeToString(mac.Sum(nil))
	id := r.Header.Get(headerEventID)
	e.mu.Lock()
	if !hmac.Equal([]byte(want), []byte(r.Header.Get(headerSignature))) {
		e.bad++
		e.mu.Unlock()
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	e.tries[id]++
	try := e.tries[id]
	b := e.behave[customer]
	hang := b == slowOnce && !e.hung[customer]
	if hang {
		e.hung[customer] = true
	}
	e.mu.Unlock()
	switch {
	case hang:
		<-r.Context().Done() // the sender's timeout ends it
		return
	case b == gone:
		http.Error(w, "gone", http.StatusGone)
		return
	case b == down, b == flaky && try <= 2:
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	case b == rateLimited && try == 1:
		w.Header().Set("Retry-After", "900")
		http.Error(w, "slow down", http.StatusTooManyRequests)
		return
	}
	e.mu.Lock()
	e.accepted[id]++ // a real receiver deduplicates by event ID; here we count
	e.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (e *endpoints) results() (map[string]int, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.accepted, e.bad
}
