package rabbitmq

import (
	"testing"
	"time"

	"github.com/ackwise/ackwise"
)

// TestSinkDropsHopHeaders: a handler that forwards, through a Sink, the
// headers of a message that came back from a wait queue (attempt 2, with a
// first failure) publishes a message whose consumer sees attempt 1 and no
// first failure: the sink drops ackwise-attempt and ackwise-first-failure.
// Before, it published them, and the downstream message started at the
// forwarded attempt, to be dead-lettered early.
func TestSinkDropsHopHeaders(t *testing.T) {
	t.Parallel()
	needBroker(t)
	from := testConfig(t, Classic, 50*time.Millisecond)
	declare(t, from)
	to := testConfig(t, Classic)
	declare(t, to)
	src := newSource(t, from)
	in := &ackwise.Message{ID: "ev-1", Payload: []byte("p"), Headers: ackwise.HeadersOf("x-tenant", "acme")}
	if err := newSink(t, SinkConfig{URL: from.URL, RoutingKey: from.Queue, ConnectionName: from.ConnectionName}).Publish(ctxT(t), in); err != nil {
		t.Fatalf("publish: %v", err)
	}
	m := receive(t, src)
	if err := src.Nack(ctxT(t), m, 0); err != nil {
		t.Fatalf("nack: %v", err)
	}
	m = receive(t, src)
	if m.Attempt != 2 || m.FirstFailure.IsZero() || !m.Headers.Has(ackwise.HeaderAttempt) || !m.Headers.Has(ackwise.HeaderFirstFailure) {
		t.Fatalf("after the wait queue: attempt %d first failure %v headers %v", m.Attempt, m.FirstFailure, m.Headers)
	}
	fwd := &ackwise.Message{ID: "ev-2", Payload: []byte("derived"), Headers: m.Headers.Clone()}
	if err := newSink(t, SinkConfig{URL: to.URL, RoutingKey: to.Queue, ConnectionName: to.ConnectionName}).Publish(ctxT(t), fwd); err != nil {
		t.Fatalf("publish: %v", err)
	}
	got := receive(t, newSource(t, to))
	if got.ID != "ev-2" || got.Attempt != 1 || !got.FirstFailure.IsZero() || got.Headers.Get("x-tenant") != "acme" {
		t.Fatalf("forwarded message: id %q attempt %d first failure %v headers %v", got.ID, got.Attempt, got.FirstFailure, got.Headers)
	}
	for _, k := range []string{ackwise.HeaderAttempt, ackwise.HeaderFirstFailure} {
		if v, ok := got.Headers.Lookup(k); ok {
			t.Errorf("forwarded message carries %s = %q", k, v)
		}
	}
	if err := src.Ack(ctxT(t), m); err != nil {
		t.Fatalf("ack: %v", err)
	}
}
