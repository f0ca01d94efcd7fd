package consumer_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
)

// gatedSource holds the Receive that returns the message gate, until
// proceed is closed; got is closed when it has it.
type gatedSource struct {
	refusingDLQ
	gate         string
	got, proceed chan struct{}
	once         *sync.Once
}

func (s gatedSource) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	n, err := s.refusingDLQ.Receive(ctx, buf)
	for _, m := range buf[:n] {
		if m.ID == s.gate {
			s.once.Do(func() {
				close(s.got)
				<-s.proceed
			})
		}
	}
	return n, err
}

// A message received while an earlier message of its key is in flight, but
// dispatched only after that message went back to the broker unsettled
// (its dead letter failed) and its lane was released, must not run ahead of
// the redelivery: it is released too, and runs after it. Before, dispatch
// found the lane idle and ran it at once (found by a randomized stress test
// on the memory log: m69 acked before m42 and m46 of its key).
func TestMessageReceivedBeforeLaneReleaseDoesNotOvertake(t *testing.T) {
	t.Parallel()
	src := gatedSource{
		refusingDLQ: refusingDLQ{newFakeSource(adapters.Capabilities{}, &ackwise.Message{ID: "first", Key: "k", Source: "q", BrokerID: "q/1", Partition: -1, Offset: -1, Attempt: 1}), true},
		gate:        "second", got: make(chan struct{}), proceed: make(chan struct{}), once: new(sync.Once),
	}
	var mu sync.Mutex
	var done []string // successful runs, in order
	started := make(chan struct{})
	c, err := consumer.New(src, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == "first" && m.Attempt == 1 {
			close(started)
			<-src.got // "second" is received, not yet dispatched
			return ackwise.Permanent(errors.New("invalid order"))
		}
		mu.Lock()
		done = append(done, m.ID)
		mu.Unlock()
		return nil
	}), consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	consumer.PinPace(c, "single") // handlers on workers: the receive loop goes on receiving
	stop := run(t, c)
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("first never ran")
	}
	src.push(&ackwise.Message{ID: "second", Key: "k", Source: "q", BrokerID: "q/2", Partition: -1, Offset: -1, Attempt: 1})
	// "first" went back (its dead letter failed) and its lane was released.
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.SettleFailed == 1 && s.InFlight == 0 }) {
		close(src.proceed)
		t.Fatalf("stats %+v", c.Stats())
	}
	close(src.proceed)
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.Acked == 2 }) {
		t.Fatalf("stats %+v", c.Stats())
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(done, []string{"first", "second"}) {
		t.Fatalf("key k's effects in the order %v: want first (its redelivery), then second", done)
	}
}
