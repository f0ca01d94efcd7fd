package rabbitmq

import (
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// TestMovesKeepTheEventIDTheHandlerSaw: a copy the source moves to a wait
// queue or the dead-letter queue has the event ID its delivery had. Before,
// a message from a foreign producer without ackwise-event-id and without a
// message-id reached the handler with no event ID, and its first copy got a
// message-id made up by the adapter, which every later hop took for its
// event ID: an inbox that had refused it (ErrNoEventID) accepted its retry,
// and the dead letter was redriven under an ID the event never had.
func TestMovesKeepTheEventIDTheHandlerSaw(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Quorum, 50*time.Millisecond)
	declare(t, cfg)
	src := newSource(t, cfg)
	plain := newSource(t, Config{URL: cfg.URL, Queue: cfg.Queue + ".dlq", Plain: true})

	for _, tc := range []struct {
		name string
		pub  amqp.Publishing
		want string
	}{
		{"none", amqp.Publishing{Body: []byte("none")}, ""},
		{"header", amqp.Publishing{Headers: amqp.Table{ackwise.HeaderEventID: "ev-1"}, Body: []byte("header")}, "ev-1"},
		{"message-id", amqp.Publishing{MessageId: "mid-1", Body: []byte("message-id")}, "mid-1"},
	} {
		rawPublish(t, c, cfg.Queue, tc.pub)
		m := receive(t, src)
		if string(m.Payload) != tc.name || m.ID != tc.want {
			t.Fatalf("%s: first delivery %q has ID %q, want %q", tc.name, m.Payload, m.ID, tc.want)
		}
		for hop := 2; hop <= 3; hop++ {
			if err := src.Nack(ctxT(t), m, 0); err != nil {
				t.Fatalf("%s: nack: %v", tc.name, err)
			}
			m = receive(t, src)
			if m.ID != tc.want || m.Attempt != hop {
				t.Fatalf("%s: after %d wait-queue hops: ID %q attempt %d, want ID %q attempt %d", tc.name, hop-1, m.ID, m.Attempt, tc.want, hop)
			}
		}
		env := dlq.New(m, dlq.ReasonPermanent, errors.New("boom"), ackwise.ClassPermanent, time.Now(), "billing", "v1")
		if err := src.DeadLetter(ctxT(t), m, env); err != nil {
			t.Fatalf("%s: dead-letter: %v", tc.name, err)
		}
		d := receive(t, plain)
		if d.ID != tc.want {
			t.Fatalf("%s: dead letter has ID %q (message-id %q), want %q", tc.name, d.ID, d.BrokerID, tc.want)
		}
		if d.BrokerID == "" {
			t.Fatalf("%s: dead letter without a message-id", tc.name)
		}
		if err := plain.Ack(ctxT(t), d); err != nil {
			t.Fatal(err)
		}
	}
}
