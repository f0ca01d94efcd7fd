package memory_test

import (
	"slices"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
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
