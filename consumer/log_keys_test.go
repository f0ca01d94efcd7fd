package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// recordLog keeps the records logged to it, with the attributes its
// logger was given (Logger.With) ahead of each record's own.
type recordLog struct {
	mu      *sync.Mutex
	records *[]map[string]slog.Value
	with    []slog.Attr
}

func newRecordLog() recordLog {
	return recordLog{mu: new(sync.Mutex), records: new([]map[string]slog.Value)}
}

func (l recordLog) Enabled(context.Context, slog.Level) bool { return true }
func (l recordLog) WithGroup(string) slog.Handler            { return l }
func (l recordLog) WithAttrs(as []slog.Attr) slog.Handler {
	l.with = append(append([]slog.Attr(nil), l.with...), as...)
	return l
}

func (l recordLog) Handle(_ context.Context, r slog.Record) error {
	m := map[string]slog.Value{"msg": slog.StringValue(r.Message)}
	for _, a := range l.with {
		m[a.Key] = a.Value
	}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value; return true })
	l.mu.Lock()
	defer l.mu.Unlock()
	*l.records = append(*l.records, m)
	return nil
}

func (l recordLog) find(msg string) map[string]slog.Value {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range *l.records {
		if r["msg"].String() == msg {
			return r
		}
	}
	return nil
}

// TestEngineLogKeys: the engine's records use the root's attribute keys,
// with one meaning each: the attempt is "attempt" on a retry and on a dead
// letter alike (the dead letter said "attempts" before), durations are
// slog.Duration values, and every record names the consumer.
func TestEngineLogKeys(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{}, msgs(1, 1)...)
	log := newRecordLog()
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return errors.New("down") })
	c, err := consumer.New(src, h, consumer.Config{
		Name:   "orders-worker",
		Logger: slog.New(log),
		Retry:  retry.Policy{MaxAttempts: 2, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	if !src.waitSettled(1, 10*time.Second) {
		t.Fatal("not dead-lettered")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	retrying, dead := log.find("retrying"), log.find("dead-lettered")
	if retrying == nil || dead == nil {
		t.Fatalf("records: retrying %v, dead-lettered %v", retrying, dead)
	}
	for name, r := range map[string]map[string]slog.Value{"retrying": retrying, "dead-lettered": dead} {
		if v := r[ackwise.LogKeyConsumer]; v.String() != "orders-worker" {
			t.Errorf("%s: %s = %v, want the consumer's name", name, ackwise.LogKeyConsumer, v)
		}
		if v := r[ackwise.LogKeyEventID]; v.String() != "e0" {
			t.Errorf("%s: %s = %v, want e0", name, ackwise.LogKeyEventID, v)
		}
		if _, ok := r["attempts"]; ok {
			t.Errorf("%s: an \"attempts\" key beside %q", name, ackwise.LogKeyAttempt)
		}
	}
	if v := retrying[ackwise.LogKeyAttempt]; v.Kind() != slog.KindInt64 || v.Int64() != 1 {
		t.Errorf("retrying: %s = %v, want 1", ackwise.LogKeyAttempt, v)
	}
	if v := dead[ackwise.LogKeyAttempt]; v.Kind() != slog.KindInt64 || v.Int64() != 2 {
		t.Errorf("dead-lettered: %s = %v, want 2 (the attempt that gave up)", ackwise.LogKeyAttempt, v)
	}
	if v := retrying[ackwise.LogKeyDelay]; v.Kind() != slog.KindDuration {
		t.Errorf("retrying: %s = %v (%v), want a slog.Duration", ackwise.LogKeyDelay, v, v.Kind())
	}
}
