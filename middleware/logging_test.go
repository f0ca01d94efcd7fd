package middleware_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
)

func TestLogging(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	fail := errors.New("db down")
	results := []error{nil, fail, ackwise.Permanent(fail)}
	i := 0
	h := middleware.Logging(logger)(ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		err := results[i]
		i++
		return err
	}))
	msg := &ackwise.Message{ID: "ev-1", Key: "acct", Source: "orders", Attempt: 2, Payload: []byte("secret-payload")}
	for _, want := range results {
		if err := h.Handle(t.Context(), msg); err != want {
			t.Fatalf("got %v, want the handler's error unchanged", err)
		}
	}
	if strings.Contains(buf.String(), "secret-payload") {
		t.Fatal("payload logged")
	}
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	for i, want := range []struct{ level, class string }{{"DEBUG", ""}, {"WARN", "transient"}, {"ERROR", "permanent"}} {
		r := recs[i]
		if r["level"] != want.level || r[ackwise.LogKeyEventID] != "ev-1" || r[ackwise.LogKeySource] != "orders" || r[ackwise.LogKeyAttempt] != float64(2) {
			t.Errorf("record %d: %v", i, r)
		}
		if c, _ := r[ackwise.LogKeyClass].(string); c != want.class {
			t.Errorf("record %d: class %q, want %q", i, c, want.class)
		}
	}
	if middleware.Logging(nil)(waitCtx) == nil {
		t.Fatal("Logging(nil) returned a nil handler")
	}
}
