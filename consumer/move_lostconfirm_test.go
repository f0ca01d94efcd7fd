package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/consumer"
)

// A dead letter stored by the destination whose confirmation was lost is
// tried again in place: the destination gets a second copy (at least once),
// the source's record is settled once, and its offset committed.
func TestPendingMoveLostConfirmation(t *testing.T) {
	t.Parallel()
	br, topic := logWithDLQ(t)
	fault := memorytest.Inject(t, br, topic+memory.DeadLetterSuffix, memory.Fault{Kind: memory.FaultFailPublish, AfterStore: true, Count: 1})
	memorytest.Publish(t, br, topic, memorytest.Msg("poison", "k", "x"), memorytest.Msg("next", "k", "y"))
	src, err := br.JoinGroup(topic, "g")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	c, err := consumer.New(src, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == "poison" {
			return ackwise.Permanent(errors.New("invalid order"))
		}
		return nil
	}), consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.DeadLettered == 1 && s.Acked == 1 && s.InFlight == 0 }) {
		t.Fatalf("stats %+v", c.Stats())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	memorytest.RequireCommitted(t, br, topic, "g", 0, 2)
	if msgs, _ := br.Messages(topic + memory.DeadLetterSuffix); len(msgs) != 2 || fault.Fired() != 1 {
		t.Fatalf("%d dead letters, %d lost confirmations: want the stored copy and the confirmed one", len(msgs), fault.Fired())
	}
	if st := c.Stats(); st.SettleFailed != 1 || st.Released != 0 || st.DeadLettered != 1 {
		t.Fatalf("stats %+v: want one failed try, one dead letter, nothing released", st)
	}
}
