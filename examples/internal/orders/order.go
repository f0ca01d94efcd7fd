package orders

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ackwise/ackwise"
)

// Order is the message payload, JSON.
type Order struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
	// WarehouseDownFor is a demo knob: the fake warehouse refuses this
	// order for its first n delivery attempts, as a dependency in an outage
	// would, so that the order is retried through the broker's retry tiers.
	// A real order has no such field.
	WarehouseDownFor int `json:"warehouse_down_for,omitempty"`
}

// ErrWarehouseDown is the fake warehouse's outage: transient, so the engine
// retries the order.
var ErrWarehouseDown = errors.New("orders: warehouse unavailable")

// Handler returns the handler that ships an order: it decodes the payload
// (an order that does not decode is permanent: dead-lettered at once, since
// no retry can fix it), asks the warehouse (transient failures are
// retried), and records the shipment through the inbox's transaction, so
// that the record and the shipment commit together, once per order however
// often the broker delivers it. work is how long the warehouse call takes.
func (s *Store) Handler(work time.Duration) ackwise.Handler {
	return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		var o Order
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return ackwise.Permanent(fmt.Errorf("decode order: %w", err))
		}
		if o.ID == "" || o.Cents <= 0 {
			return ackwise.Permanent(fmt.Errorf("order %q: want an id and cents > 0, got %d", o.ID, o.Cents))
		}
		if work > 0 {
			t := time.NewTimer(work)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		if msg.Attempt <= o.WarehouseDownFor {
			return fmt.Errorf("order %s, attempt %d: %w", o.ID, msg.Attempt, ErrWarehouseDown)
		}
		return s.ship(ctx, o)
	})
}

// Demo returns n demo orders (n ≥ 1) and the prefix of their IDs, unique
// to this call, so that a second demo run against the same inbox is not
// taken for duplicates:
// every fourth finds the warehouse down for its first two attempts (and
// succeeds on its third), and the last is poison (a payload that does not
// decode), which is dead-lettered. Each has its event ID (Message.ID) and
// its customer as the key, so one customer's orders are handled in order.
func Demo(n int) (idPrefix string, msgs []*ackwise.Message) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	idPrefix = "demo-" + hex.EncodeToString(b[:]) + "-"
	msgs = make([]*ackwise.Message, n)
	for i := range n {
		o := Order{ID: fmt.Sprintf("%s%04d", idPrefix, i), Customer: fmt.Sprintf("cust-%d", i%7), Cents: int64(100 + i)}
		if i%4 == 3 {
			o.WarehouseDownFor = 2
		}
		payload, _ := json.Marshal(o)
		if i == n-1 {
			payload = []byte(`{"id": "` + o.ID + `", "cents": "lots"`)
		}
		msgs[i] = &ackwise.Message{ID: o.ID, Key: o.Customer, Payload: payload, Headers: ackwise.HeadersOf("content-type", "application/json")}
	}
	return idPrefix, msgs
}
