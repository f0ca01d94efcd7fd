package consumer

import (
	"testing"
	"time"

	"github.com/ackwise/ackwise"
)

// TestAgesTable: a publish time from the future, at or before the epoch
// (Kafka's -1 for none) or absent counts from the receive; the oldest per
// source is reported, 0 once its messages finished; slots are reused.
func TestAgesTable(t *testing.T) {
	t.Parallel()
	recv := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	a := ages{on: true}
	slots := map[string]int32{}
	for _, m := range []struct {
		id, source string
		at         time.Time
	}{
		{"old", "orders", recv.Add(-time.Hour)},
		{"new", "orders", recv.Add(-time.Minute)},
		{"future", "payments", recv.Add(24 * time.Hour)},
		{"kafka-none", "payments", time.UnixMilli(-1)},
		{"unset", "refunds", time.Time{}},
	} {
		slots[m.id] = a.startLocked(&ackwise.Message{Source: m.source, PublishedAt: m.at}, recv)
	}
	read := func(now time.Time) map[string]time.Duration {
		got := map[string]time.Duration{}
		a.oldestLocked(now, func(src string, age time.Duration) { got[src] = age })
		return got
	}
	now := recv.Add(10 * time.Second)
	got := read(now)
	want := map[string]time.Duration{"orders": time.Hour + 10*time.Second, "payments": 10 * time.Second, "refunds": 10 * time.Second}
	for src, w := range want {
		if got[src] != w {
			t.Errorf("%s: age %v, want %v", src, got[src], w)
		}
	}
	a.endLocked(slots["old"])
	if got := read(now); got["orders"] != time.Minute+10*time.Second {
		t.Errorf("after the oldest finished: %v, want 1m10s", got["orders"])
	}
	for _, id := range []string{"new", "future", "kafka-none", "unset"} {
		a.endLocked(slots[id])
	}
	for src, age := range read(now) {
		if age != 0 {
			t.Errorf("%s: age %v with nothing in flight, want 0", src, age)
		}
	}
	n := len(a.slots)
	a.startLocked(&ackwise.Message{Source: "orders"}, recv)
	if len(a.slots) != n || len(a.free) != n-1 {
		t.Errorf("a slot was not reused: %d slots, %d free", len(a.slots), len(a.free))
	}
}

// BenchmarkAgesTable is the lag table's cost per message on dispatch's
// path: a slot taken and given back (64 in flight).
func BenchmarkAgesTable(b *testing.B) {
	a := ages{on: true}
	now := time.Now()
	msgs := make([]*ackwise.Message, 64)
	slots := make([]int32, len(msgs))
	for i := range msgs {
		msgs[i] = &ackwise.Message{Source: "orders", PublishedAt: now.Add(-time.Second)}
		slots[i] = a.startLocked(msgs[i], now)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := i % len(msgs)
		a.endLocked(slots[k])
		slots[k] = a.startLocked(msgs[k], now)
	}
}
