package consumer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// seqSource delivers total messages of one key, "k", in order (with
// distinct, each with a key and a partition of its own), and counts them;
// settles are accepted and counted.
type seqSource struct {
	mu        sync.Mutex
	cond      *sync.Cond
	delivered int
	total     int
	acked     int
	distinct  bool
}

func newSeqSource(total int) *seqSource {
	s := &seqSource{total: total}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *seqSource) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.delivered >= s.total && ctx.Err() == nil {
		s.cond.Wait()
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	for n < len(buf) && s.delivered < s.total {
		m := &ackwise.Message{ID: fmt.Sprint(s.delivered), Key: "k", Partition: -1, Offset: -1, Handle: s.delivered}
		if s.distinct {
			m.Key, m.Source, m.Partition = fmt.Sprint("key-", s.delivered), "s", int32(s.delivered)
		}
		buf[n] = m
		s.delivered++
		n++
	}
	s.cond.Broadcast()
	return n, nil
}

// awaitAcked blocks until n messages were acked.
func (s *seqSource) awaitAcked(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.acked < n {
		s.cond.Wait()
	}
}

// awaitDelivered blocks until n messages were delivered.
func (s *seqSource) awaitDelivered(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.delivered < n {
		s.cond.Wait()
	}
}

func (s *seqSource) Ack(context.Context, *ackwise.Message) error {
	s.mu.Lock()
	s.acked++
	s.mu.Unlock()
	s.cond.Broadcast()
	return nil
}
func (s *seqSource) Nack(context.Context, *ackwise.Message, time.Duration) error      { return nil }
func (s *seqSource) DeadLetter(context.Context, *ackwise.Message, dlq.Envelope) error { return nil }
func (s *seqSource) Release(context.Context, *ackwise.Message) error                  { return nil }
func (s *seqSource) ExtendLease(context.Context, *ackwise.Message, time.Duration) error {
	return nil
}
func (s *seqSource) Valid(*ackwise.Message) bool         { return true }
func (s *seqSource) Capabilities() adapters.Capabilities { return adapters.Capabilities{Delay: true} }
func (s *seqSource) Extensions() adapters.Extensions     { return adapters.Extensions{} }
func (s *seqSource) Close() error                        { return nil }

// TestLaneQueueStaysBoundedWhileBusy: a key that stays busy through a long
// backlog (one hot key; with OrderPartition, every partition) keeps its
// lane's queue within a few times MaxInFlight (invariant 6). Before, the
// queue was only reset when the lane went idle: each message appended to it
// and popped from its head, so while the backlog lasted its backing array
// grew by one slot per message ever queued on the key.
func TestLaneQueueStaysBoundedWhileBusy(t *testing.T) {
	t.Parallel()
	for _, ord := range []Ordering{OrderKey, OrderPartition} {
		t.Run(ord.String(), func(t *testing.T) {
			const total, inflight = 3000, 4
			src := newSeqSource(total)
			var c *Consumer
			maxCap := 0
			h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
				i := m.Handle.(int)
				// Messages 0..i-1 are finished: wait until the receive loop
				// filled the in-flight places again, so the lane's queue is
				// not empty when this message finishes and the lane never
				// goes idle before the end of the backlog.
				src.awaitDelivered(min(total, i+inflight))
				c.mu.Lock()
				for _, ln := range c.lanes.byKey {
					maxCap = max(maxCap, cap(ln.queue))
				}
				for _, ln := range c.lanes.byPart {
					maxCap = max(maxCap, cap(ln.queue))
				}
				c.mu.Unlock()
				return nil
			})
			var err error
			c, err = New(src, h, Config{Concurrency: 1, MaxInFlight: inflight, Ordering: ord})
			if err != nil {
				t.Fatal(err)
			}
			// Handlers on the workers: inline, the receive loop would be
			// running the handler that waits for it.
			c.pace.fixed = true
			c.pace.mode.Store(modeSingle)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			src.awaitAcked(total)
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if maxCap > 4*inflight {
				t.Fatalf("a busy lane's queue grew to %d slots for %d messages, MaxInFlight %d", maxCap, total, inflight)
			}
		})
	}
}

// TestLanesStayBoundedOverManyKeys: keys (or partitions) seen once each
// leave idle lanes behind; the lanes kept, in the map and for reuse, stay
// within laneLimit however many keys went by (invariant 6), instead of one
// per key ever seen.
func TestLanesStayBoundedOverManyKeys(t *testing.T) {
	t.Parallel()
	for _, o := range []Ordering{OrderKey, OrderPartition} {
		t.Run(o.String(), func(t *testing.T) {
			t.Parallel()
			src := newSeqSource(20000)
			src.distinct = true
			c, err := New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil }), Config{Ordering: o, MaxInFlight: 64})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- c.Run(ctx) }()
			src.awaitAcked(src.total)
			c.mu.Lock()
			lanes, free := len(c.lanes.byKey)+len(c.lanes.byPart), len(c.lanes.free)
			c.mu.Unlock()
			cancel()
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if lanes+free > c.lanes.limit {
				t.Fatalf("%d lanes kept (%d in the map, %d free) after %d keys: more than the limit %d", lanes+free, lanes, free, src.total, c.lanes.limit)
			}
		})
	}
}
