package consumer_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// refusingDLQ refuses every dead letter, and the delivery goes with it (the
// connection dropped under the publish), so the engine hands the message
// back. With redeliver, Release hands the message back at once, at its
// next attempt, as a new delivery with the same broker ID (none: a
// RabbitMQ message published without a message-id); without, the broker
// never delivers it again (another consumer settled it, say).
type refusingDLQ struct {
	*fakeSource
	redeliver bool
}

func (s refusingDLQ) DeadLetter(_ context.Context, m *ackwise.Message, _ dlq.Envelope) error {
	s.lose(m)
	return errors.New("dead-letter queue: connection reset by peer")
}

func (s refusingDLQ) Release(ctx context.Context, m *ackwise.Message) error {
	err := s.fakeSource.Release(ctx, m)
	if s.redeliver {
		s.push(&ackwise.Message{ID: m.ID, Key: m.Key, Source: m.Source, BrokerID: m.BrokerID, Partition: -1, Offset: -1, Attempt: m.Attempt + 1})
	}
	return err
}

// refusingPoison is a refusingDLQ holding the message "poison" of broker ID
// brokerID.
func refusingPoison(brokerID string, redeliver bool) refusingDLQ {
	return refusingDLQ{newFakeSource(adapters.Capabilities{}, &ackwise.Message{ID: "poison", BrokerID: brokerID, Source: "q", Partition: -1, Offset: -1, Attempt: 1}), redeliver}
}

// poisonOnClock runs a consumer of src on a virtual clock that moves only
// when the test advances it. Its handler passes each message to seen, fails
// the message "poison" as permanent (its dead letter is attempted) and
// acks the others. It returns the consumer, the clock and Run's stop.
func poisonOnClock(t *testing.T, src adapters.Source, seen func(*ackwise.Message)) (*consumer.Consumer, *memory.VirtualClock, func() error) {
	t.Helper()
	clock := memory.NewVirtualClock(time.Unix(0, 0))
	c, err := consumer.New(src, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		seen(m)
		if m.ID == "poison" {
			return ackwise.Permanent(errors.New("invalid order"))
		}
		return nil
	}), consumer.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return c, clock, run(t, c)
}

// A message without a broker ID (a RabbitMQ message published without a
// message-id) is recognised by its content when it comes back: a message
// whose dead letter always fails must not loop as fast as the broker
// redelivers it. Its redelivery is held on the engine's clock (here a
// virtual clock that does not move), so it does not run again.
func TestFailingSettleWithoutBrokerIDDoesNotSpin(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	_, clock, stop := poisonOnClock(t, refusingPoison("", true), func(*ackwise.Message) { runs.Add(1) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		t.Errorf("no pause after a failed dead letter: the message ran %d times as fast as it was redelivered", runs.Load())
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the message ran %d times with the clock stopped: want once, then its redelivery held", n)
	}
}

// Beside healthy traffic too, and without holding that traffic back: each
// healthy message is handled while the redeliveries of the one without a
// broker ID wait. Before, such a message was only slowed by a pause of the
// whole intake, and only while nothing else was settled: beside traffic it
// looped (or, on this clock that does not move, the pause stopped
// everything).
func TestFailingSettleWithoutBrokerIDHeldBesideTraffic(t *testing.T) {
	t.Parallel()
	src := refusingPoison("", true)
	var runs atomic.Int64
	c, _, stop := poisonOnClock(t, src, func(m *ackwise.Message) {
		if m.ID == "poison" {
			runs.Add(1)
		}
	})
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.SettleFailed >= 1 }) {
		t.Fatalf("the poison's dead letter was not attempted: stats %+v", c.Stats())
	}
	const healthy = 50
	for i := range healthy {
		src.push(&ackwise.Message{ID: "h" + strconv.Itoa(i), Key: "k", Payload: []byte("x"), Source: "q", Partition: -1, Offset: -1})
		if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.Acked == uint64(i+1) }) {
			t.Fatalf("healthy message %d not handled beside the failing one: stats %+v", i, c.Stats())
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the message whose dead letter fails ran %d times beside %d healthy ones with the clock stopped: want once, its redelivery held", n, healthy)
	}
}

// Messages without a broker ID are told apart by content: one with the
// same key and event ID as a message whose settle failed, but another
// payload, is not held.
func TestFailedSettleWithoutBrokerIDHoldsOnlyItsContent(t *testing.T) {
	t.Parallel()
	src := refusingPoison("", false)
	var handled sync.Map
	c, _, stop := poisonOnClock(t, src, func(m *ackwise.Message) { handled.Store(string(m.Payload), true) })
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.SettleFailed == 1 && s.InFlight == 0 }) {
		t.Fatalf("stats %+v", c.Stats())
	}
	// The same event ID, as a producer that reuses IDs would send; the
	// handler fails it too ("poison"), but its dead letter is not held.
	src.push(&ackwise.Message{ID: "poison", Payload: []byte("other"), Source: "q", Partition: -1, Offset: -1})
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.SettleFailed == 2 }) {
		t.Fatalf("a message with another payload was held with the clock stopped: stats %+v", c.Stats())
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, ok := handled.Load("other"); !ok {
		t.Fatal("the message with another payload never ran")
	}
}

// The redelivery of a message whose settle failed waits in place (10ms, then
// 20ms, on the engine's clock) and then runs at the attempt the broker gave
// it: the wait is not a retry, and does not count one.
func TestHeldRedeliveryKeepsItsAttempt(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var attempts []int
	_, clock, stop := poisonOnClock(t, refusingPoison("q/1", true), func(m *ackwise.Message) {
		mu.Lock()
		attempts = append(attempts, m.Attempt)
		mu.Unlock()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, wait := range []time.Duration{10 * time.Millisecond, 20 * time.Millisecond} {
		if err := clock.WaitForTimers(ctx, 1); err != nil {
			t.Fatalf("the redelivery was not held: %v", err)
		}
		clock.Advance(wait)
	}
	if err := clock.WaitForTimers(ctx, 1); err != nil { // the third delivery, held
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(attempts, []int{1, 2, 3}) {
		t.Fatalf("the message ran at attempts %v: want 1, 2, 3 (one per delivery)", attempts)
	}
}

// A message whose settle failed is remembered so that its redeliveries
// wait; if none comes (another consumer settled it), it is forgotten a
// minute after its wait, or every message would go on taking the engine's
// lock to look itself up.
func TestFailedSettleForgottenWhenItNeverComesBack(t *testing.T) {
	t.Parallel()
	src := refusingPoison("q/a", false)
	c, clock, _ := poisonOnClock(t, src, func(*ackwise.Message) {})
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.SettleFailed == 1 && s.InFlight == 0 }) {
		t.Fatalf("stats %+v", c.Stats())
	}
	if n := consumer.FailedSettles(c); n != 1 {
		t.Fatalf("%d messages remembered after a failed dead letter, want 1", n)
	}
	clock.Advance(2 * time.Minute)
	src.push(&ackwise.Message{ID: "b", BrokerID: "q/b", Source: "q", Partition: -1, Offset: -1})
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.Acked == 1 && s.InFlight == 0 }) {
		t.Fatalf("stats %+v", c.Stats())
	}
	if n := consumer.FailedSettles(c); n != 0 {
		t.Fatalf("%d messages still remembered two minutes after their wait, want 0", n)
	}
}

// The handler may replace the payload it was given (decode it in place of
// the raw body, say): the redelivery of a message without a broker ID
// carries the body the broker has, and is recognised by that, as received,
// not by what the handler left in the message. Before, the identity was
// taken after the handler ran, the redelivery was not recognised and ran at
// once, as fast as the broker redelivered it.
func TestFailedSettleWithoutBrokerIDHeldAfterHandlerReplacedPayload(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	_, clock, stop := poisonOnClock(t, refusingPoison("", true), func(m *ackwise.Message) {
		runs.Add(1)
		m.Payload = []byte("decoded") // the broker's copy is unchanged
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		t.Errorf("the redelivery was not held: the message ran %d times with the clock stopped", runs.Load())
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the message ran %d times with the clock stopped: want once, then its redelivery held", n)
	}
}
