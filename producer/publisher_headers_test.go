package producer_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/producer"
)

// TestHeaderEventIDKept: a caller that carries the event ID in the
// ackwise-event-id header only (a forwarded or redriven message, an outbox
// row) keeps it. Before, Publish gave it a new ID, and consumers' inboxes
// took it for a different event.
func TestHeaderEventIDKept(t *testing.T) {
	b, sink := setup(t)
	p, err := producer.New(sink, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	msg := &ackwise.Message{Headers: ackwise.HeadersOf(ackwise.HeaderEventID, "caller-id")}
	if err := p.Publish(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	stored, _ := b.Messages("orders")
	if msg.ID != "caller-id" || stored[0].ID != "caller-id" || stored[0].Headers.Get(ackwise.HeaderEventID) != "caller-id" {
		t.Fatalf("msg.ID %q, stored ID %q header %q; want caller-id", msg.ID, stored[0].ID, stored[0].Headers.Get(ackwise.HeaderEventID))
	}
}

// TestCallerTraceparentKept: a traceparent the caller set (a forwarded
// message, an outbox relay carrying the original request's trace) is not
// overwritten by the span in ctx.
func TestCallerTraceparentKept(t *testing.T) {
	_, sink := setup(t)
	p, _ := producer.New(sink, producer.Config{})
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(context.Background(), "relay")
	defer span.End()
	const orig = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	msg := &ackwise.Message{ID: "e1", Headers: ackwise.HeadersOf(ackwise.HeaderTraceparent, orig, "tracestate", "vendor=old")}
	if err := p.Publish(ctx, msg); err != nil {
		t.Fatal(err)
	}
	if got := msg.Headers.Get(ackwise.HeaderTraceparent); got != orig {
		t.Fatalf("traceparent %q overwritten (tracestate left: %q), want %q", got, msg.Headers.Get("tracestate"), orig)
	}
	// In another case too: the consumer matches traceparent in any case,
	// and would follow a second, lowercase one added beside it.
	fwd := &ackwise.Message{ID: "e2", Headers: ackwise.HeadersOf("Traceparent", orig)}
	if err := p.Publish(ctx, fwd); err != nil {
		t.Fatal(err)
	}
	if fwd.Headers.Has(ackwise.HeaderTraceparent) {
		t.Fatalf("a second traceparent added beside the forwarded Traceparent: %v", fwd.Headers)
	}
}
