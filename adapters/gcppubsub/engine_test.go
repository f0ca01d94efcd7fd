package gcppubsub

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// A poison message, under the consumer engine, is dead-lettered to the
// dead-letter topic with the full envelope, its data byte for byte, its
// attributes and ordering key kept, and is not delivered again; the good
// message beside it is handled and acked.
func TestEnginePoisonDeadLettered(t *testing.T) {
	t.Parallel()
	poison := &ackwise.Message{ID: "ev-poison", Key: "order-7", Payload: []byte{0xff, 0x00, 0xfe, 'j', 's', 'o', 'n', 0x80}, Headers: ackwise.HeadersOf("x-tenant", "acme", "authorization", "Bearer s3cret")}
	good := &ackwise.Message{ID: "ev-good", Key: "order-8", Payload: []byte(`{"ok":true}`)}
	f, d := withMessages(t, nil, poison, good)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src, err := NewSource(ctx, d.sourceConfig(f))
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan string, 10)
	c, err := consumer.New(src, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		handled <- m.ID
		if m.ID == poison.ID {
			return ackwise.Permanent(errors.New("cannot decode order"))
		}
		return nil
	}), consumer.Config{Name: "billing", Version: "v1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(rctx) }()

	dl := f.awaitDeadLetters(ctx, t, d, 1)
	for seen := map[string]bool{}; !seen[good.ID]; {
		select {
		case id := <-handled:
			seen[id] = true
		case <-ctx.Done():
			t.Fatal("the good message was not handled")
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	if len(dl) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dl))
	}
	m := dl[0]
	if !bytes.Equal(m.Payload, poison.Payload) {
		t.Errorf("dead letter data %x, want %x", m.Payload, poison.Payload)
	}
	if m.ID != poison.ID || m.Key != poison.Key || m.Headers.Get("x-tenant") != "acme" {
		t.Errorf("dead letter id %q key %q headers %v", m.ID, m.Key, m.Headers)
	}
	if m.Headers.Has("authorization") {
		t.Errorf("dead letter keeps the authorization header")
	}
	env, err := dlq.Decode(m.Headers)
	if err != nil {
		t.Fatal(err)
	}
	want := "projects/" + testProject + "/subscriptions/" + d.sub
	switch {
	case env.Reason != dlq.ReasonPermanent || env.ErrorClass != "permanent" || env.Error == "":
		t.Errorf("envelope reason %q class %q error %q", env.Reason, env.ErrorClass, env.Error)
	case env.Source != want || env.MessageID == "" || env.Partition != -1 || env.Offset != -1:
		t.Errorf("envelope source %q message %q position %d@%d", env.Source, env.MessageID, env.Partition, env.Offset)
	case env.Attempts != 1 || env.FirstFailure.IsZero() || env.LastFailure.IsZero():
		t.Errorf("envelope attempts %d failures %v %v", env.Attempts, env.FirstFailure, env.LastFailure)
	case env.Consumer != "billing" || env.ConsumerVersion != "v1.2.3":
		t.Errorf("envelope consumer %q %q", env.Consumer, env.ConsumerVersion)
	}
	// Both originals were acked: pstest holds them as acked once.
	for _, pm := range f.srv.Messages() {
		if pm.Topic == "projects/"+testProject+"/topics/"+d.topic && (pm.Acks != 1 || pm.Deliveries != 1) {
			t.Errorf("message %s: %d deliveries, %d acks, want 1 and 1", pm.Attributes[ackwise.HeaderEventID], pm.Deliveries, pm.Acks)
		}
	}
}
