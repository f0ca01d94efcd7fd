package middleware_test

import (
	"context"
	"regexp"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/meminbox"
)

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	m := &ackwise.Message{ID: "ev-1", BrokerID: "a", Attempt: 1}
	redelivery := &ackwise.Message{Headers: ackwise.HeadersOf(ackwise.HeaderEventID, "ev-1"), BrokerID: "b", Attempt: 3, Payload: []byte("x")}
	k := middleware.IdempotencyKey(m, "billing", "charge")
	if !regexp.MustCompile(`^ackwise-[0-9a-f]{32}$`).MatchString(k) {
		t.Fatalf("key %q has the wrong shape", k)
	}
	if k2 := middleware.IdempotencyKey(redelivery, "billing", "charge"); k2 != k {
		t.Fatalf("redelivery got key %q, want %q", k2, k)
	}
	distinct := map[string]string{k: "base"}
	for name, key := range map[string]string{
		"other step":     middleware.IdempotencyKey(m, "billing", "email"),
		"other consumer": middleware.IdempotencyKey(m, "shipping", "charge"),
		"other event":    middleware.IdempotencyKey(&ackwise.Message{ID: "ev-2"}, "billing", "charge"),
		"shifted parts":  middleware.IdempotencyKey(&ackwise.Message{ID: "ev-1c"}, "billing", "harge"),
	} {
		if prev, dup := distinct[key]; dup {
			t.Errorf("%s and %s share key %s", name, prev, key)
		}
		distinct[key] = name
	}
	if k := middleware.IdempotencyKey(&ackwise.Message{}, "billing", "charge"); k != "" {
		t.Fatalf("no event ID gave key %q, want \"\"", k)
	}
}

// TestInboxIdempotencyKey: under an inbox the key follows the event ID the
// inbox claimed, KeyFunc's when one is set; outside one there is none.
func TestInboxIdempotencyKey(t *testing.T) {
	t.Parallel()
	if k := middleware.InboxIdempotencyKey(context.Background(), "charge"); k != "" {
		t.Fatalf("outside an inbox: key %q, want \"\"", k)
	}
	msg := &ackwise.Message{ID: "transport-id", Headers: ackwise.HeadersOf("order-id", "o-42")}
	keyOf := func(cfg middleware.InboxConfig, msg *ackwise.Message) string {
		t.Helper()
		mw, err := middleware.Inbox(meminbox.New(nil), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		h := mw(ackwise.HandlerFunc(func(ctx context.Context, _ *ackwise.Message) error {
			got = middleware.InboxIdempotencyKey(ctx, "charge")
			return nil
		}))
		if err := h.Handle(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got, want := keyOf(middleware.InboxConfig{Consumer: "billing"}, msg), middleware.IdempotencyKey(msg, "billing", "charge"); got != want || got == "" {
		t.Fatalf("default KeyFunc: key %q, want %q", got, want)
	}
	byOrder := middleware.InboxConfig{Consumer: "billing", KeyFunc: func(m *ackwise.Message) (string, error) {
		return m.Headers.Get("order-id"), nil
	}}
	got := keyOf(byOrder, msg)
	if want := middleware.IdempotencyKey(&ackwise.Message{ID: "o-42"}, "billing", "charge"); got != want {
		t.Fatalf("custom KeyFunc: key %q, want the one of event o-42, %q", got, want)
	}
	// Another transport ID, the same order: the same key.
	if again := keyOf(byOrder, &ackwise.Message{ID: "other-transport-id", Headers: ackwise.HeadersOf("order-id", "o-42")}); again != got {
		t.Fatalf("the same order under another transport ID: key %q, want %q", again, got)
	}
	if k := keyOf(middleware.InboxConfig{Consumer: "billing", AllowMissingKey: true}, &ackwise.Message{}); k != "" {
		t.Fatalf("a message let through without a key: key %q, want \"\"", k)
	}
}
