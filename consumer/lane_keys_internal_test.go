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

// keysSource delivers total messages, each with a key and a partition of
// its own, and closes done once all are acked.
type keysSource struct {
	mu               sync.Mutex
	delivered, acked int
	total            int
	done             chan struct{}
}

func (s *keysSource) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	s.mu.Lock()
	if s.delivered >= s.total {
		s.mu.Unlock()
		<-ctx.Done()
		return 0, ctx.Err()
	}
	defer s.mu.Unlock()
	n := 0
	for n < len(buf) && s.delivered < s.total {
		buf[n] = &ackwise.Message{ID: fmt.Sprint(s.delivered), Key: fmt.Sprint("key-", s.delivered), Source: "s", Partition: int32(s.delivered), Offset: -1}
		s.delivered++
		n++
	}
	return n, nil
}

func (s *keysSource) Ack(context.Context, *ackwise.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.acked++; s.acked == s.total {
		close(s.done)
	}
	return nil
}
func (s *keysSource) Nack(context.Context, *ackwise.Message, time.Duration) error      { return nil }
func (s *keysSource) DeadLetter(context.Context, *ackwise.Message, dlq.Envelope) error { return nil }
func (s *keysSource) Release(context.Context, *ackwise.Message) error                  { return nil }
func (s *keysSource) ExtendLease(context.Context, *ackwise.Message, time.Duration) error {
	return nil
}
func (s *keysSource) Valid(*ackwise.Message) bool         { return true }
func (s *keysSource) Capabilities() adapters.Capabilities { return adapters.Capabilities{Delay: true} }
func (s *keysSource) Close() error                        { return nil }

// TestLanesStayBoundedOverManyKeys: keys (or partitions) seen once each
// leave idle lanes behind; the lanes kept, in the map and for reuse, stay
// within laneLimit however many keys went by (invariant 6), instead of one
// per key ever seen.
func TestLanesStayBoundedOverManyKeys(t *testing.T) {
	t.Parallel()
	for _, o := range []Ordering{OrderKey, OrderPartition} {
		t.Run(o.String(), func(t *testing.T) {
			t.Parallel()
			src := &keysSource{total: 20000, done: make(chan struct{})}
			c, err := New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil }), Config{Ordering: o, MaxInFlight: 64})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- c.Run(ctx) }()
			select {
			case <-src.done:
			case <-time.After(20 * time.Second):
				t.Fatal("not all messages acked")
			}
			c.mu.Lock()
			lanes, free := len(c.keyLanes)+len(c.partLanes), len(c.freeLanes)
			c.mu.Unlock()
			cancel()
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if lanes+free > c.laneLimit {
				t.Fatalf("%d lanes kept (%d in the map, %d free) after %d keys: more than the limit %d", lanes+free, lanes, free, src.total, c.laneLimit)
			}
		})
	}
}
