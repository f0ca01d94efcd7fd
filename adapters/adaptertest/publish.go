package adaptertest

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
)

func testPublishReceive(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{})
	in := batch(20, 5)
	in[0].Payload = []byte{0, 0xff, 0xfe, '\n', 0x80} // not UTF-8
	in[0].Headers.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	h.publish(t, f, in)
	rec := h.newRecorder(nil)
	h.start(t, f.NewSource(t), rec, consumer.Config{})
	rec.waitFor(t, "20 messages", func() bool { return len(rec.byID) == len(in) })
	rec.mu.Lock()
	defer rec.mu.Unlock()
	byID := map[string]*ackwise.Message{}
	for _, m := range rec.seen {
		byID[m.ID] = m
	}
	for _, want := range in {
		got := byID[want.ID]
		if got == nil {
			t.Fatalf("message %s not received", want.ID)
		}
		if !bytes.Equal(got.Payload, want.Payload) {
			t.Errorf("%s payload %q, want %q", want.ID, got.Payload, want.Payload)
		}
		if got.Key != want.Key {
			t.Errorf("%s key %q, want %q", want.ID, got.Key, want.Key)
		}
		for _, kv := range want.Headers {
			k, v := kv.Key, kv.Value
			if got.Headers.Get(k) != v {
				t.Errorf("%s header %s = %q, want %q", want.ID, k, got.Headers.Get(k), v)
			}
		}
		if got.Headers.Get(ackwise.HeaderEventID) != want.ID {
			t.Errorf("%s: header %s = %q", want.ID, ackwise.HeaderEventID, got.Headers.Get(ackwise.HeaderEventID))
		}
		if got.Attempt != 1 {
			t.Errorf("%s attempt %d, want 1", want.ID, got.Attempt)
		}
		if got.Source == "" {
			t.Errorf("%s: Source not set", want.ID)
		}
	}
}

// testSinkDropsHopHeaders: a message published through the Sink with the
// engine's hop headers (a handler forwarding the headers of a retry it
// handled) arrives as a new message: at attempt 1, without them.
func testSinkDropsHopHeaders(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{})
	in := batch(1, 1)
	in[0].Headers.Set(ackwise.HeaderAttempt, "4")
	in[0].Headers.Set(ackwise.HeaderFirstFailure, "2026-01-02T03:04:05Z")
	in[0].Headers.Set("x-kept", "yes")
	h.publish(t, f, in)
	got := h.receiveOne(t, f.NewSource(t))
	if got.Attempt != 1 || !got.FirstFailure.IsZero() {
		t.Errorf("attempt %d, first failure %v: want 1 and none", got.Attempt, got.FirstFailure)
	}
	for _, k := range []string{ackwise.HeaderAttempt, ackwise.HeaderFirstFailure} {
		if got.Headers.Has(k) {
			t.Errorf("header %s = %q published", k, got.Headers.Get(k))
		}
	}
	if got.Headers.Get("x-kept") != "yes" {
		t.Errorf("header x-kept = %q, want the other headers kept", got.Headers.Get("x-kept"))
	}
}

// testPublishPerMessage: when the broker refuses the last message of a
// Publish call, Publish returns an *adapters.PublishError that lists it
// alone; the others are confirmed, and delivered, and the refused one is
// never delivered.
func testPublishPerMessage(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{})
	if f.Refuse == nil {
		t.Skip("the harness cannot make the broker refuse one message alone (Fixture.Refuse nil): per-message publish errors not checked")
	}
	in := batch(3, 1)
	bad := len(in) - 1
	f.Refuse(t, in[bad])
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	err := f.Sink.Publish(ctx, in...)
	pe, ok := errors.AsType[*adapters.PublishError](err)
	if !ok || len(pe.Failed) != 1 || pe.Failed[0].Index != bad {
		t.Fatalf("Publish = %v, want an *adapters.PublishError listing msgs[%d] alone", err, bad)
	}
	src := f.NewSource(t)
	want := map[string]bool{in[0].ID: true, in[1].ID: true}
	for len(want) > 0 {
		m := h.receiveOne(t, src)
		if !want[m.ID] {
			t.Fatalf("received %s, want one of the confirmed %v", m.ID, want)
		}
		delete(want, m.ID)
		if err := src.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	requireNothingMore(ctx, t, src, time.Second, "after the confirmed messages: the refused one was stored")
}
