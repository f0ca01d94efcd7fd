package rabbitmq

import (
	"slices"
	"testing"

	"github.com/ackwise/ackwise"
)

// TestSinkCCAndBCCRoute: headers CC and BCC on a published message are
// RabbitMQ's sender-selected distribution, routing keys the message also
// goes to. The broker takes them only as an array of strings; the sink
// sent them as strings, so the broker refused the message and closed the
// channel. Now each CC or BCC header is one routing key: the message
// reaches its queue and every queue they name, the copies keep CC, and
// the broker removes BCC (it is blind).
func TestSinkCCAndBCCRoute(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	extra := []string{cfg.Queue + "-cc1", cfg.Queue + "-cc2", cfg.Queue + "-bcc"}
	for _, q := range extra {
		plainQueue(t, c, q)
	}
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName})
	h := ackwise.HeadersOf("CC", extra[0], "x-tenant", "acme")
	h.Add("CC", extra[1])
	h.Add("BCC", extra[2])
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "cc", Payload: []byte("p"), Headers: h}); err != nil {
		t.Fatalf("Publish with CC and BCC headers: %v (class %v)", err, ackwise.ClassOf(err))
	}
	for _, q := range append([]string{cfg.Queue}, extra...) {
		ds := getAll(t, c, q)
		if len(ds) != 1 {
			t.Fatalf("queue %s holds %d messages, want 1", q, len(ds))
		}
		d := ds[0]
		if id, _ := d.Headers[ackwise.HeaderEventID].(string); id != "cc" || string(d.Body) != "p" || d.Headers["x-tenant"] != "acme" {
			t.Fatalf("queue %s: event ID %q, body %q, headers %v", q, id, d.Body, d.Headers)
		}
		if cc, _ := d.Headers["CC"].([]any); !slices.Equal(cc, []any{extra[0], extra[1]}) {
			t.Fatalf("queue %s: CC = %#v, want both routing keys in order", q, d.Headers["CC"])
		}
		if v, ok := d.Headers["BCC"]; ok {
			t.Fatalf("queue %s: BCC = %#v, want it removed by the broker", q, v)
		}
	}
}
