package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"github.com/ackwise/ackwise"
)

// deliverer POSTs events to the customers' endpoints.
type deliverer struct {
	bill    *billing
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
	done, err := d.bill.delivered(ctx, msg.ID)
	if err != nil {
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
		return d.bill.recordDelivery(ctx, msg.ID, msg.Key, d.clock.Now())
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
