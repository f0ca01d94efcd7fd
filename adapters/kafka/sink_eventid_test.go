package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
)

// TestSinkEventIDFromMessageID: Message.ID is the event ID (adapters.EventID,
// and what producer.Publisher sets and returns to its caller), so the record
// carries it as its only ackwise-event-id header, as the other sinks and
// TransactSession do. Before, an ackwise-event-id header the message already
// carried won over Message.ID: a stale one (headers copied from another
// event) or an empty one was written instead, and consumers' inboxes keyed
// the event by an ID its producer never gave it (or by none).
func TestSinkEventIDFromMessageID(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	sink := openSink(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs := []*ackwise.Message{
		{ID: "new-id", Payload: []byte("a"), Headers: ackwise.HeadersOf("h", "1", ackwise.HeaderEventID, "old-id", "g", "2")},
		{ID: "id-2", Payload: []byte("b"), Headers: ackwise.HeadersOf(ackwise.HeaderEventID, "")},
		{Payload: []byte("c"), Headers: ackwise.HeadersOf(ackwise.HeaderEventID, "header-only", "h", "3")},
	}
	if err := sink.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	recs := readAll(ctx, t, brokers, cfg.Topic)
	if len(recs) != len(msgs) {
		t.Fatalf("%d records, want %d", len(recs), len(msgs))
	}
	for i, r := range recs {
		want := msgs[i].EventID()
		var ids []string
		var others []string
		for _, h := range r.Headers {
			if h.Key == ackwise.HeaderEventID {
				ids = append(ids, string(h.Value))
			} else {
				others = append(others, h.Key+"="+string(h.Value))
			}
		}
		if len(ids) != 1 || ids[0] != want {
			t.Errorf("record %d (payload %q): %s headers %q, want exactly [%q]", i, r.Value, ackwise.HeaderEventID, ids, want)
		}
		var wantOthers []string
		for _, h := range msgs[i].Headers {
			if h.Key != ackwise.HeaderEventID {
				wantOthers = append(wantOthers, h.Key+"="+h.Value)
			}
		}
		if len(others) != len(wantOthers) {
			t.Errorf("record %d: other headers %q, want %q", i, others, wantOthers)
			continue
		}
		for j := range others {
			if others[j] != wantOthers[j] {
				t.Errorf("record %d: other headers %q, want %q in order", i, others, wantOthers)
				break
			}
		}
	}
}
