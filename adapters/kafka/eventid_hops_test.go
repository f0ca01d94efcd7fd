package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// TestHopsKeepTheEventIDTheHandlerSaw: a record's copies on a retry topic
// and on the dead-letter topic carry the event ID its first delivery had,
// and a record without one stays without one (Kafka has no broker message
// ID a copy could be given instead): the handler sees the same Message.ID
// on every hop, so an inbox keys every attempt alike.
func TestHopsKeepTheEventIDTheHandlerSaw(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1, 100*time.Millisecond)
	sink := openSink(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := sink.Publish(ctx,
		&ackwise.Message{Key: "k", Payload: []byte("none"), Headers: ackwise.HeadersOf("x", "1")},
		&ackwise.Message{ID: "ev-1", Key: "k", Payload: []byte("ev-1")},
	); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"none": "", "ev-1": "ev-1"}
	src := openSource(t, cfg)
	for attempt := 1; attempt <= 2; attempt++ {
		for _, m := range receiveN(t, src, 2) {
			if m.ID != want[string(m.Payload)] || m.Attempt != attempt {
				t.Fatalf("delivery %q: ID %q attempt %d, want ID %q attempt %d", m.Payload, m.ID, m.Attempt, want[string(m.Payload)], attempt)
			}
			var err error
			if attempt == 1 {
				err = src.Nack(ctx, m, 0)
			} else {
				err = src.DeadLetter(ctx, m, dlq.Envelope{Reason: dlq.ReasonPermanent, Source: cfg.Topic, Partition: -1, Offset: -1})
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	dead := readAll(ctx, t, brokers, cfg.Topic+DefaultDeadLetterSuffix)
	if len(dead) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dead))
	}
	for _, r := range dead {
		if m := recordMessage(r); m.ID != want[string(r.Value)] {
			t.Errorf("dead letter %q has event ID %q, want %q", r.Value, m.ID, want[string(r.Value)])
		}
	}
}
