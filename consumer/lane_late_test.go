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

// runOnWorkers runs a consumer of src with handler h on workers (pace
// pinned to single), so that the receive loop goes on receiving while
// handlers run, and returns it with its stop.
func runOnWorkers(t *testing.T, src adapters.Source, h ackwise.Handler) (*consumer.Consumer, func() error) {
	t.Helper()
	c, err := consumer.New(src, h, consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	consumer.PinPace(c, "single")
	return c, run(t, c)
}

// laneMsg is a first delivery of key k with broker ID bid.
func laneMsg(id, bid string) *ackwise.Message {
	return &ackwise.Message{ID: id, Key: "k", Source: "q", BrokerID: bid, Partition: -1, Offset: -1, Attempt: 1}
}

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
	c, stop := runOnWorkers(t, src, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == "first" && m.Attempt == 1 {
			close(started)
			<-src.got // "second" is received, not yet dispatched
			return ackwise.Permanent(errors.New("invalid order"))
		}
		mu.Lock()
		done = append(done, m.ID)
		mu.Unlock()
		return nil
	}))
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
	requireFirstThenSecond(t, c, stop, src.proceed, &mu, &done)
}

// relayRace is a refusingDLQ that redelivers what it releases, with gates
// that force one interleaving: the release of "second" (queued behind
// "first", which went back) waits until the redelivery of "first" was
// dispatched (a later Receive began), and the Receive that returns the
// redelivery of "second" waits for proceed.
type relayRace struct {
	refusingDLQ
	mu           sync.Mutex
	firstAgain   bool          // the redelivery of "first" was returned
	dispatched   chan struct{} // closed when a Receive begins after that
	secondAgain  chan struct{} // closed when Receive has the redelivery of "second"
	proceed      chan struct{}
	once1, once2 sync.Once
}

func (s *relayRace) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	s.mu.Lock()
	if s.firstAgain {
		s.once1.Do(func() { close(s.dispatched) })
	}
	s.mu.Unlock()
	n, err := s.refusingDLQ.Receive(ctx, buf)
	for _, m := range buf[:n] {
		switch {
		case m.ID == "first" && m.Attempt == 2:
			s.mu.Lock()
			s.firstAgain = true
			s.mu.Unlock()
		case m.ID == "second" && m.Attempt == 2:
			s.once2.Do(func() {
				close(s.secondAgain)
				<-s.proceed
			})
		}
	}
	return n, err
}

func (s *relayRace) Release(ctx context.Context, m *ackwise.Message) error {
	if m.ID == "second" && m.Attempt == 1 {
		<-s.dispatched
	}
	return s.refusingDLQ.Release(ctx, m)
}

// A message goes back to the broker (its dead letter failed) while another
// message of its key waits behind it, and its redelivery arrives while that
// one is still being released: queued behind it, the redelivery is released
// too. The message behind, redelivered meanwhile but dispatched only once the
// lane is idle, must not run ahead of the returned message's next
// redelivery. Before, the redelivery's arrival had cleared the lane's mark,
// and it ran at once (found by TestStressLog: m12 acked before m4 of its
// key, the redelivery of m4 released behind m12).
func TestRedeliveryReleasedBehindItsLaneDoesNotLoseItsPlace(t *testing.T) {
	t.Parallel()
	src := &relayRace{
		refusingDLQ: refusingDLQ{newFakeSource(adapters.Capabilities{}, laneMsg("first", "q/1"), laneMsg("second", "q/2")), true},
		dispatched:  make(chan struct{}), secondAgain: make(chan struct{}), proceed: make(chan struct{}),
	}
	var mu sync.Mutex
	var done []string // successful runs, in order
	c, stop := runOnWorkers(t, src, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == "first" && m.Attempt == 1 {
			return ackwise.Permanent(errors.New("invalid order"))
		}
		mu.Lock()
		done = append(done, m.ID)
		mu.Unlock()
		return nil
	}))
	select {
	case <-src.secondAgain:
	case <-time.After(5 * time.Second):
		close(src.proceed)
		t.Fatalf("the redelivery of second never came: %+v", c.Stats())
	}
	// first, second and first's redelivery were released; the lane is idle.
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.InFlight == 0 }) {
		close(src.proceed)
		t.Fatalf("stats %+v", c.Stats())
	}
	requireFirstThenSecond(t, c, stop, src.proceed, &mu, &done)
}

// requireFirstThenSecond lets a gated source proceed, waits until both
// messages are acked, stops Run and checks that key k's effects (done,
// under mu) came in the order first (its redelivery), then second.
func requireFirstThenSecond(t *testing.T, c *consumer.Consumer, stop func() error, proceed chan struct{}, mu *sync.Mutex, done *[]string) {
	t.Helper()
	close(proceed)
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.Acked == 2 }) {
		t.Fatalf("stats %+v", c.Stats())
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(*done, []string{"first", "second"}) {
		t.Fatalf("key k's effects in the order %v: want first (its redelivery), then second", *done)
	}
}

// releaseOrder is a refusingDLQ (no redeliveries) that records the order of
// its releases, holds the Receive that returns "third" until proceed, and
// holds the release of "second" until a Receive begins after "third" was
// returned (so "third" was dispatched meanwhile).
type releaseOrder struct {
	refusingDLQ
	mu            sync.Mutex
	released      []string
	thirdOut      bool
	got, proceed  chan struct{} // "third" is in a Receive's hands; let it return
	releasing     chan struct{} // the release of "second" began
	dispatched    chan struct{} // a Receive began after "third" was returned
	once1, once2  sync.Once
	onceReleasing sync.Once
}

func (s *releaseOrder) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	s.mu.Lock()
	if s.thirdOut {
		s.once1.Do(func() { close(s.dispatched) })
	}
	s.mu.Unlock()
	n, err := s.refusingDLQ.Receive(ctx, buf)
	for _, m := range buf[:n] {
		if m.ID == "third" {
			s.once2.Do(func() {
				close(s.got)
				<-s.proceed
			})
			s.mu.Lock()
			s.thirdOut = true
			s.mu.Unlock()
		}
	}
	return n, err
}

func (s *releaseOrder) Release(ctx context.Context, m *ackwise.Message) error {
	if m.ID == "second" {
		s.onceReleasing.Do(func() { close(s.releasing) })
		<-s.dispatched
	}
	s.mu.Lock()
	s.released = append(s.released, m.ID)
	s.mu.Unlock()
	return s.refusingDLQ.Release(ctx, m)
}

// A message goes back to the broker (its dead letter failed) while another
// message of its key waits behind it; a third message of the key, received
// before that but dispatched while the one behind is still being released,
// must go back after it, not before: a queue that puts a released message
// at the back redelivers in the order of the releases. Before, dispatch
// released it at once, beside the lane's release, and it could reach the
// broker first (found by TestLostReceiptsAtRandom: e53 released before e35,
// e41 and e47 of its key).
func TestLateMessageReleasedAfterItsLane(t *testing.T) {
	t.Parallel()
	src := &releaseOrder{
		refusingDLQ: refusingDLQ{newFakeSource(adapters.Capabilities{}, laneMsg("first", "q/1"), laneMsg("second", "q/2")), false},
		got:         make(chan struct{}), proceed: make(chan struct{}),
		releasing: make(chan struct{}), dispatched: make(chan struct{}),
	}
	defer func() {
		select {
		case <-src.proceed:
		default:
			close(src.proceed)
		}
	}()
	c, stop := runOnWorkers(t, src, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == "first" {
			<-src.got // "third" is received, not yet dispatched
			return ackwise.Permanent(errors.New("invalid order"))
		}
		return nil
	}))
	// "first" runs, "second" waits behind it; the next Receive returns
	// "third" and waits.
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.InFlight == 2 }) {
		t.Fatalf("stats %+v", c.Stats())
	}
	src.push(laneMsg("third", "q/3"))
	// "first" went back, and the release of "second" began.
	select {
	case <-src.releasing:
	case <-time.After(5 * time.Second):
		t.Fatalf("second never released: %+v", c.Stats())
	}
	close(src.proceed) // "third" is dispatched now, the lane still releasing
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.InFlight == 0 }) {
		t.Fatalf("stats %+v", c.Stats())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if !slices.Equal(src.released, []string{"first", "second", "third"}) {
		t.Fatalf("released %v, want first, second, third: key k's order", src.released)
	}
}
