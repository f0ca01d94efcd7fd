package middleware_test

import (
	"regexp"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
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
