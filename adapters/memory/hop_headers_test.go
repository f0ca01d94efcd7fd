package memory_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/dlq"
)

// TestSinkDropsHopHeaders: a message published with ackwise-attempt and
// ackwise-first-failure (the headers of a retry a handler forwarded) is
// stored without them, on a queue and on a topic, as the Kafka and RabbitMQ
// sinks publish it; the caller's headers are left as they were. Before, the
// memory sink stored them.
func TestSinkDropsHopHeaders(t *testing.T) {
	tb := setup(t)
	q := tb.queue(t, "q", memory.QueueConfig{})
	if err := tb.b.CreateTopic("t", memory.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	member := tb.member(t, "t", "g")
	for _, c := range []struct {
		dest string
		src  adapters.Source
	}{{"q", q}, {"t", member}} {
		hdrs := ackwise.HeadersOf("x-tenant", "acme", ackwise.HeaderAttempt, "4", ackwise.HeaderFirstFailure, "2020-01-02T03:04:05Z")
		in := &ackwise.Message{ID: "ev-" + c.dest, Payload: []byte("p"), Headers: hdrs}
		plain := &ackwise.Message{ID: "ev-plain-" + c.dest, Payload: []byte("p"), Headers: ackwise.HeadersOf("x-tenant", "acme")}
		tb.publish(t, c.dest, in, plain)
		for _, m := range recv(t, c.src, 2) {
			if keys := m.Headers.Keys(); !slices.Equal(keys, []string{"x-tenant", ackwise.HeaderEventID}) {
				t.Errorf("%s: %s stored with headers %v", c.dest, m.ID, m.Headers)
			}
			if m.Attempt != 1 || !m.FirstFailure.IsZero() {
				t.Errorf("%s: %s attempt %d first failure %v", c.dest, m.ID, m.Attempt, m.FirstFailure)
			}
		}
		if len(in.Headers) != 3 {
			t.Errorf("%s: the caller's headers changed: %v", c.dest, in.Headers)
		}
	}
}

// TestForgedCountHeadersCountForNothing: the memory broker counts attempts
// itself (a queue's receive count, a log's redeliveries) and reads no count
// a producer can set. A message published with a forged ackwise-attempt,
// an envelope's ackwise-dlq-attempts, an x-delivery-count and an x-death
// is delivered as attempt 1, then 2, and its dead letter says 2 attempts,
// on a queue and on a topic: as on the other adapters, a count header
// counts only on a hop the broker's own topology made (the memory broker
// makes none).
func TestForgedCountHeadersCountForNothing(t *testing.T) {
	tb := setup(t)
	q := tb.queue(t, "q", memory.QueueConfig{MaxReceives: 5})
	if err := tb.b.CreateTopic("t", memory.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	member := tb.member(t, "t", "g")
	for _, c := range []struct {
		dest string
		src  adapters.Source
	}{{"q", q}, {"t", member}} {
		forged := ackwise.HeadersOf(
			ackwise.HeaderAttempt, "1000000000",
			dlq.HeaderAttempts, "9223372036854775807",
			dlq.HeaderReason, string(dlq.ReasonMaxAttempts),
			"x-delivery-count", "1000000000",
			"x-death", "count=1000000000",
		)
		tb.publish(t, c.dest, &ackwise.Message{ID: "forged-" + c.dest, Payload: []byte("p"), Headers: forged})
		m := recvOne(t, c.src)
		if m.Attempt != 1 {
			t.Fatalf("%s: first delivery is attempt %d, want 1", c.dest, m.Attempt)
		}
		if err := c.src.Release(tb.ctx, m); err != nil {
			t.Fatal(err)
		}
		m = recvOne(t, c.src)
		if m.Attempt != 2 {
			t.Fatalf("%s: second delivery is attempt %d, want 2", c.dest, m.Attempt)
		}
		env := dlq.New(m, dlq.ReasonPermanent, errors.New("bad"), ackwise.ClassPermanent, tb.clk.Now(), "c", "")
		if err := c.src.DeadLetter(tb.ctx, m, env); err != nil {
			t.Fatal(err)
		}
		dead, err := tb.b.Messages(c.dest + memory.DeadLetterSuffix)
		if err != nil || len(dead) != 1 {
			t.Fatalf("%s: dead letters %v, %v", c.dest, dead, err)
		}
		got, err := dlq.Decode(dead[0].Headers)
		if err != nil {
			t.Fatal(err)
		}
		if got.Attempts != 2 || got.Reason != dlq.ReasonPermanent {
			t.Fatalf("%s: dead letter says %d attempts, reason %s; want 2, permanent", c.dest, got.Attempts, got.Reason)
		}
	}
}
