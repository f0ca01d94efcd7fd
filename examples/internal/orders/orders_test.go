package orders

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
)

// TestDemo: the demo's layout, which the examples' summaries rely on.
func TestDemo(t *testing.T) {
	prefix, msgs := Demo(9)
	other, _ := Demo(9)
	if prefix == other || len(msgs) != 9 {
		t.Fatalf("prefixes %q %q (want distinct), %d messages", prefix, other, len(msgs))
	}
	for i, m := range msgs {
		if !strings.HasPrefix(m.ID, prefix) || m.Key == "" {
			t.Fatalf("message %d: ID %q key %q", i, m.ID, m.Key)
		}
		var o Order
		err := json.Unmarshal(m.Payload, &o)
		switch {
		case i == 8:
			if err == nil {
				t.Fatalf("the last message decodes: %s", m.Payload)
			}
		case err != nil || o.ID != m.ID:
			t.Fatalf("message %d: %v, %+v", i, err, o)
		case (i == 3 || i == 7) != (o.WarehouseDownFor == 2):
			t.Fatalf("message %d: warehouse down for %d", i, o.WarehouseDownFor)
		}
	}
}

// TestTally: outcomes of other messages are passed on and not counted; a
// message settled twice (a dead letter written again) counts once; Done
// closes once every message is settled.
func TestTally(t *testing.T) {
	var passed int
	next := observerFunc(func(*ackwise.Message, consumer.Outcome, time.Duration) { passed++ })
	tl := NewTally(next, "demo-x-", 2)
	tl.Observe(&ackwise.Message{ID: "other"}, consumer.Acked, 0)
	tl.Observe(&ackwise.Message{ID: "demo-x-0"}, consumer.Retried, 0)
	tl.Observe(&ackwise.Message{ID: "demo-x-0"}, consumer.Acked, 0)
	tl.Observe(&ackwise.Message{ID: "demo-x-0"}, consumer.Acked, 0)
	select {
	case <-tl.Done():
		t.Fatal("done with one of two settled")
	default:
	}
	tl.Observe(&ackwise.Message{ID: "demo-x-1"}, consumer.DeadLettered, 0)
	<-tl.Done()
	if got := tl.Summary(); passed != 5 || got != (Summary{Orders: 2, Acked: 1, DeadLettered: 1, Retried: 1}) {
		t.Fatalf("passed on %d, summary %+v", passed, got)
	}
}

type observerFunc func(*ackwise.Message, consumer.Outcome, time.Duration)

func (f observerFunc) Observe(m *ackwise.Message, o consumer.Outcome, d time.Duration) { f(m, o, d) }
