package dlq_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	t.Parallel()
	first := time.Date(2026, 11, 29, 10, 0, 0, 123000000, time.UTC)
	last := first.Add(90 * time.Second)
	msg := &ackwise.Message{
		ID: "e1", Source: "orders", Partition: 3, Offset: 42, BrokerID: "orders/3@42", Attempt: 5,
		FirstFailure: first,
		Headers:      ackwise.HeadersOf("x-tenant", "acme", dlq.HeaderReason, "stale"),
	}
	env := dlq.New(msg, dlq.ReasonMaxAttempts, errors.New("db down"), ackwise.ClassTransient, last, "billing", "v2")
	h := env.Apply(msg.Headers)
	if h.Get("x-tenant") != "acme" {
		t.Fatal("original header lost")
	}
	if msg.Headers.Get(dlq.HeaderReason) != "stale" {
		t.Fatal("Apply changed the message's own headers")
	}
	got, err := dlq.Decode(h)
	if err != nil {
		t.Fatal(err)
	}
	if got != env {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, env)
	}
	if got.Reason != dlq.ReasonMaxAttempts || got.Attempts != 5 || got.Partition != 3 || got.Offset != 42 || got.ErrorClass != "transient" {
		t.Fatalf("decoded %+v", got)
	}
	stripped := dlq.Strip(h)
	for _, kv := range stripped {
		k := kv.Key
		if strings.HasPrefix(k, dlq.HeaderPrefix) {
			t.Fatalf("Strip kept %s", k)
		}
	}
	if stripped.Get("x-tenant") != "acme" {
		t.Fatal("Strip lost an original header")
	}
}

func TestQueueEnvelopeHasNoPosition(t *testing.T) {
	t.Parallel()
	msg := &ackwise.Message{Source: "q", Partition: -1, Offset: -1, Attempt: 1}
	env := dlq.New(msg, dlq.ReasonPermanent, errors.New("bad"), ackwise.ClassPermanent, time.Now(), "c", "")
	h := env.Apply(nil)
	if _, ok := h.Lookup(dlq.HeaderPartition); ok {
		t.Fatal("partition header on a queue message")
	}
	if _, ok := h.Lookup(dlq.HeaderConsumerVersion); ok {
		t.Fatal("empty consumer version written")
	}
	got, err := dlq.Decode(h)
	if err != nil || got.Partition != -1 || got.Offset != -1 {
		t.Fatalf("Decode = %+v, %v", got, err)
	}
	if !got.FirstFailure.Equal(got.LastFailure) {
		t.Fatal("first failure should default to the last on a first attempt")
	}
}

func TestErrorTextIsBounded(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", dlq.MaxErrorLen) // 2 bytes a rune
	got := dlq.BoundError(long)
	if len(got) > dlq.MaxErrorLen || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Fatalf("bounded to %d bytes, valid=%v", len(got), utf8.ValidString(got))
	}
	if dlq.BoundError("short") != "short" {
		t.Fatal("short text changed")
	}
}

func TestDecodeRejectsBadFields(t *testing.T) {
	t.Parallel()
	if _, err := dlq.Decode(nil); err == nil {
		t.Fatal("headers without an envelope accepted")
	}
	for _, h := range []string{dlq.HeaderPartition, dlq.HeaderOffset, dlq.HeaderAttempts, dlq.HeaderFirstFailure} {
		_, err := dlq.Decode(ackwise.HeadersOf(dlq.HeaderReason, "permanent", h, "nope"))
		if err == nil || !strings.Contains(err.Error(), h) {
			t.Fatalf("bad %s: %v", h, err)
		}
	}
}

// TestApplyLeavesOutCredentials: credentials a producer put in headers are
// not copied into the dead letter, whatever their case; other headers are.
func TestApplyLeavesOutCredentials(t *testing.T) {
	t.Parallel()
	msg := &ackwise.Message{ID: "e1", Source: "orders", Headers: ackwise.HeadersOf(
		"Authorization", "Bearer s3cret", "x-api-key", "k3y", "COOKIE", "session=abc", "trace-id", "t1")}
	env := dlq.New(msg, dlq.ReasonPermanent, errors.New("bad"), ackwise.ClassPermanent, time.Now(), "svc", "v1")
	h := env.Apply(msg.Headers)
	for _, kv := range h {
		if dlq.IsSecretHeader(kv.Key) || strings.Contains(kv.Value, "s3cret") || kv.Value == "k3y" {
			t.Errorf("dead letter carries %s: %q", kv.Key, kv.Value)
		}
	}
	if h.Get("trace-id") != "t1" {
		t.Errorf("dead letter lost header trace-id: %v", h)
	}
	if _, err := dlq.Decode(h); err != nil {
		t.Errorf("no envelope: %v", err)
	}
}

// nilPtrError's Error dereferences its receiver, as most do: a typed nil
// *nilPtrError returned as an error panics when its text is asked for.
type nilPtrError struct{ text string }

func (e *nilPtrError) Error() string { return e.text }

func TestNewSurvivesErrorTextThatPanics(t *testing.T) {
	t.Parallel()
	var typedNil *nilPtrError
	err := ackwise.Permanent(typedNil) // not nil: an interface holding a nil pointer
	env := dlq.New(&ackwise.Message{Attempt: 1}, dlq.ReasonPermanent, err, ackwise.ClassPermanent, time.Now(), "c", "")
	if !strings.Contains(env.Error, "PANIC") {
		t.Fatalf("Error = %q: want the text fmt gives an Error method that panicked", env.Error)
	}
}

// TestRedriveCountSurvivesDeadLettering: ackwise-redrive-count is one of
// the message's own headers, not an envelope header: Apply (dead-lettering
// again) and Strip (redrive) keep it, so that a redriven message that fails
// again carries its count into the next dead letter.
func TestRedriveCountSurvivesDeadLettering(t *testing.T) {
	t.Parallel()
	if strings.HasPrefix(dlq.HeaderRedriveCount, dlq.HeaderPrefix) {
		t.Fatalf("%s starts with the envelope prefix %s: Apply would replace it", dlq.HeaderRedriveCount, dlq.HeaderPrefix)
	}
	msg := &ackwise.Message{ID: "e1", Attempt: 1, Headers: ackwise.HeadersOf("x-tenant", "acme", dlq.HeaderRedriveCount, "2")}
	env := dlq.New(msg, dlq.ReasonPermanent, errors.New("bad"), ackwise.ClassPermanent, time.Now(), "billing", "")
	h := env.Apply(msg.Headers)
	if h.Get(dlq.HeaderRedriveCount) != "2" || dlq.Strip(h).Get(dlq.HeaderRedriveCount) != "2" {
		t.Fatalf("Apply or Strip lost %s: %v", dlq.HeaderRedriveCount, h)
	}
	for _, c := range []struct {
		v  string
		n  int
		ok bool
	}{{"", 0, false}, {"0", 0, true}, {"7", 7, true}, {"-1", 0, false}, {"x", 0, false}, {"1e3", 0, false}, {"99999999999999999999", 0, false}} {
		n, ok := dlq.RedriveCount(ackwise.HeadersOf(dlq.HeaderRedriveCount, c.v))
		if n != c.n || ok != c.ok {
			t.Errorf("RedriveCount(%q) = %d, %v; want %d, %v", c.v, n, ok, c.n, c.ok)
		}
	}
	if n, ok := dlq.RedriveCount(nil); n != 0 || !ok {
		t.Errorf("RedriveCount without the header = %d, %v; want 0, true", n, ok)
	}
}
