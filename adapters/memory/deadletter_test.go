package memory_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/dlq"
)

// A dead letter written while the delivery stopped being settleable (the
// lease ran out; the partition was reset) stays, the message is not
// settled, DeadLetter fails with ErrReceiptInvalid and the message is
// delivered again, as QueueSource.DeadLetter and GroupSource.DeadLetter
// document. The dead-letter queue's publish hook moves things along
// mid-write (a Match that fires nothing).
func TestDeadLetterInvalidatedDuringWrite(t *testing.T) {
	t.Parallel()
	duringWrite := func(t *testing.T, tb *testBundle, dlqName string, f func()) {
		t.Helper()
		if err := tb.b.CreateQueue(dlqName, memory.QueueConfig{}); err != nil {
			t.Fatal(err)
		}
		var once atomic.Bool
		memorytest.Inject(t, tb.b, dlqName, memory.Fault{Kind: memory.FaultFailPublish, Match: func(*ackwise.Message) bool {
			if !once.Swap(true) {
				f()
			}
			return false
		}})
	}
	check := func(t *testing.T, tb *testBundle, src adapters.Source, m *ackwise.Message, dlqName string) {
		t.Helper()
		err := src.DeadLetter(tb.ctx, m, dlq.Envelope{Reason: dlq.ReasonPermanent, Error: "bad"})
		if !errors.Is(err, adapters.ErrReceiptInvalid) {
			t.Fatalf("DeadLetter = %v, want ErrReceiptInvalid", err)
		}
		dls, err := tb.b.Messages(dlqName)
		if err != nil {
			t.Fatal(err)
		}
		if len(dls) != 1 || dls[0].ID != m.ID {
			t.Fatalf("dead letters = %q, want [%s]: the dead letter written before the failure stays", ids(dls), m.ID)
		}
		again := recvOne(t, src)
		if again.ID != m.ID || again.Attempt != 2 {
			t.Fatalf("redelivery = %s attempt %d, want %s attempt 2", again.ID, again.Attempt, m.ID)
		}
		memorytest.RequireNotDeadLettered(t, tb.b, m.Source, m.ID)
	}
	t.Run("queue lease ran out", func(t *testing.T) {
		t.Parallel()
		tb := setup(t)
		src := tb.queue(t, "q", memory.QueueConfig{Lease: 10 * time.Second})
		duringWrite(t, tb, "q.dlq", func() { tb.clk.Advance(10 * time.Second) })
		tb.publish(t, "q", msg("a", ""))
		check(t, tb, src, recvOne(t, src), "q.dlq")
	})
	t.Run("log partition reset", func(t *testing.T) {
		t.Parallel()
		tb := setup(t)
		if err := tb.b.CreateTopic("t", memory.TopicConfig{}); err != nil {
			t.Fatal(err)
		}
		src := tb.member(t, "t", "g")
		duringWrite(t, tb, "t.dlq", func() {
			if err := tb.b.SeekGroup("t", "g", 0, memory.OffsetEarliest); err != nil {
				t.Error(err)
			}
		})
		tb.publish(t, "t", msg("a", "k"))
		check(t, tb, src, recvOne(t, src), "t.dlq")
	})
}
