package producer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/retry"
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

// TestLastErrorKeptOnCancel: when ctx ends while Publish waits for the next
// attempt, the error still wraps the broker's (before, only ctx's).
func TestLastErrorKeptOnCancel(t *testing.T) {
	b, sink := setup(t)
	if _, err := b.InjectFault("orders", memory.Fault{Kind: memory.FaultFailPublish}); err != nil {
		t.Fatal(err)
	}
	p, _ := producer.New(sink, producer.Config{Retry: retry.Policy{InitialInterval: time.Second, Jitter: retry.NoJitter}})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := p.Publish(ctx, &ackwise.Message{ID: "e1"})
	if !errors.Is(err, memory.ErrInjected) {
		t.Fatalf("Publish = %v, want it to wrap the broker's error", err)
	}
}
