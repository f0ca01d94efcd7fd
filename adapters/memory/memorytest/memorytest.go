package memorytest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/dlq"
)

// DefaultTimeout bounds every WaitFor* helper (and Receive) in real time.
const DefaultTimeout = 10 * time.Second

// NewBroker returns a broker of the test's own on a fresh
// memory.VirtualClock (at memory.VirtualStart), with history on.
func NewBroker(t testing.TB) (*memory.Broker, *memory.VirtualClock) {
	t.Helper()
	clk := memory.NewVirtualClock(time.Time{})
	b, err := memory.New(memory.Config{Clock: clk})
	if err != nil {
		t.Fatalf("memorytest: %v", err)
	}
	return b, clk
}

// Msg returns a message with the given event ID, key and payload.
func Msg(id, key, payload string) *ackwise.Message {
	return &ackwise.Message{ID: id, Key: key, Payload: []byte(payload)}
}

// Publish publishes msgs into dest on b and fails the test on error.
func Publish(t testing.TB, b *memory.Broker, dest string, msgs ...*ackwise.Message) {
	t.Helper()
	if err := b.Publish(context.Background(), dest, msgs...); err != nil {
		t.Fatalf("memorytest: publish into %s: %v", dest, err)
	}
}

// Receive receives exactly n messages from src (in as many Receive calls as
// it takes) and fails the test when they do not come within DefaultTimeout.
func Receive(t testing.TB, src adapters.Source, n int) []*ackwise.Message {
	t.Helper()
	ctx, cancel := timeout(t)
	defer cancel()
	out := make([]*ackwise.Message, 0, n)
	buf := make([]*ackwise.Message, n)
	for len(out) < n {
		k, err := src.Receive(ctx, buf[:n-len(out)])
		if err != nil {
			t.Fatalf("memorytest: received %d of %d messages: %v", len(out), n, err)
		}
		out = append(out, buf[:k]...)
	}
	return out
}

// DeadLetter is a dead-lettering found in the history.
type DeadLetter struct {
	// Event is the dead-lettering event on the source queue or topic.
	Event memory.Event
	// Envelope is the envelope the consumer gave (Reason only, for the
	// broker's own redrive after MaxReceives).
	Envelope dlq.Envelope
	// Message is the dead letter as it sits in the dead-letter destination
	// (the last one with the event ID), or nil when it is no longer there
	// (consumed).
	Message *ackwise.Message
}

func timeout(t testing.TB) (context.Context, context.CancelFunc) {
	d := DefaultTimeout
	if dt, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := dt.Deadline(); ok {
			if left := time.Until(dl) - time.Second; left < d {
				d = max(left, time.Millisecond)
			}
		}
	}
	return context.WithTimeout(context.Background(), d)
}

func history(t testing.TB, b *memory.Broker, dest string) []memory.Event {
	t.Helper()
	evs, err := b.History(dest)
	if err != nil {
		t.Fatalf("memorytest: %v", err)
	}
	return evs
}

func find(evs []memory.Event, kind memory.EventKind, id string) (memory.Event, bool) {
	for _, e := range evs {
		if e.Kind == kind && e.ID == id {
			return e, true
		}
	}
	return memory.Event{}, false
}

// describe renders the events about id (or key, when byKey) for a failure
// message.
func describe(evs []memory.Event, match func(memory.Event) bool) string {
	var sb strings.Builder
	n := 0
	for _, e := range evs {
		if match(e) {
			sb.WriteString("\n\t")
			sb.WriteString(e.String())
			n++
		}
	}
	if n == 0 {
		return " (no events)"
	}
	return sb.String()
}

func byID(id string) func(memory.Event) bool {
	return func(e memory.Event) bool { return e.ID == id }
}

// RequireAcked fails the test unless the message id was acked on dest, and
// returns the (first) ack event.
func RequireAcked(t testing.TB, b *memory.Broker, dest, id string) memory.Event {
	t.Helper()
	evs := history(t, b, dest)
	e, ok := find(evs, memory.EventAcked, id)
	if !ok {
		t.Fatalf("memorytest: %s: message %q was not acked; its history:%s", dest, id, describe(evs, byID(id)))
	}
	return e
}

// Events returns the events of dest's history about the message id, oldest
// first, for assertions the other helpers do not cover.
func Events(t testing.TB, b *memory.Broker, dest, id string) []memory.Event {
	t.Helper()
	var out []memory.Event
	for _, e := range history(t, b, dest) {
		if e.ID == id {
			out = append(out, e)
		}
	}
	return out
}

// RequireNacked fails the test unless the message id was nacked on dest at
// least once, and returns the nack events (their Delay is the delay asked
// for, their Attempt the failed attempt).
func RequireNacked(t testing.TB, b *memory.Broker, dest, id string) []memory.Event {
	t.Helper()
	evs := history(t, b, dest)
	var out []memory.Event
	for _, e := range evs {
		if e.Kind == memory.EventNacked && e.ID == id {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		t.Fatalf("memorytest: %s: message %q was not nacked; its history:%s", dest, id, describe(evs, byID(id)))
	}
	return out
}

// RequireNotAcked fails the test if the message id was acked on dest.
func RequireNotAcked(t testing.TB, b *memory.Broker, dest, id string) {
	t.Helper()
	requireNone(t, b, dest, id, memory.EventAcked)
}

// requireNone fails the test if dest's history has an event of kind about
// the message id.
func requireNone(t testing.TB, b *memory.Broker, dest, id string, kind memory.EventKind) {
	t.Helper()
	evs := history(t, b, dest)
	if _, ok := find(evs, kind, id); ok {
		t.Fatalf("memorytest: %s: message %q was %s; its history:%s", dest, id, kind, describe(evs, byID(id)))
	}
}

// RequireDeadLettered fails the test unless the message id was dead-lettered
// from dest with reason (any reason when reason is empty), and returns the
// dead letter for further checks.
func RequireDeadLettered(t testing.TB, b *memory.Broker, dest, id string, reason dlq.Reason) DeadLetter {
	t.Helper()
	evs := history(t, b, dest)
	for _, e := range evs {
		if e.Kind == memory.EventDeadLettered && e.ID == id && (reason == "" || e.Reason == reason) {
			return deadLetter(t, b, e)
		}
	}
	t.Fatalf("memorytest: %s: message %q was not dead-lettered (reason %q); its history:%s", dest, id, reason, describe(evs, byID(id)))
	return DeadLetter{}
}

func deadLetter(t testing.TB, b *memory.Broker, e memory.Event) DeadLetter {
	t.Helper()
	dl := DeadLetter{Event: e, Envelope: dlq.Envelope{Reason: e.Reason, Partition: -1, Offset: -1}}
	if e.Envelope != nil {
		dl.Envelope = *e.Envelope
	}
	msgs, err := b.Messages(e.To)
	if err != nil {
		t.Fatalf("memorytest: dead-letter destination of %s: %v", e.Dest, err)
	}
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].ID == e.ID {
			dl.Message = msgs[i]
			break
		}
	}
	return dl
}

// RequireNotDeadLettered fails the test if the message id was dead-lettered
// from dest.
func RequireNotDeadLettered(t testing.TB, b *memory.Broker, dest, id string) {
	t.Helper()
	requireNone(t, b, dest, id, memory.EventDeadLettered)
}

// RequireDeliveries fails the test unless the message id was delivered
// exactly n times on dest (duplicates and redeliveries included).
func RequireDeliveries(t testing.TB, b *memory.Broker, dest, id string, n int) {
	t.Helper()
	evs := history(t, b, dest)
	got := 0
	for _, e := range evs {
		if e.Kind == memory.EventDelivered && e.ID == id {
			got++
		}
	}
	if got != n {
		t.Fatalf("memorytest: %s: message %q was delivered %d times, want %d; its history:%s", dest, id, got, n, describe(evs, byID(id)))
	}
}

// RequireHandledInOrder fails the test unless every message with key that was
// published on dest was settled (acked or dead-lettered by a consumer) and
// the first settlements came in publish order. The broker's own redrive
// after QueueConfig.MaxReceives is not a settlement: no consumer handled
// that message. Each stored message counts, so an event ID published twice
// (a producer's retry) must be settled twice. It returns the event IDs in
// settlement order.
func RequireHandledInOrder(t testing.TB, b *memory.Broker, dest, key string) []string {
	t.Helper()
	evs := history(t, b, dest)
	// Stored messages are told apart by BrokerID: an event ID may be
	// published more than once.
	var published, settled []string
	idOf := map[string]string{}
	seen := map[string]bool{}
	for _, e := range evs {
		if e.Key != key {
			continue
		}
		switch e.Kind {
		case memory.EventPublished:
			published = append(published, e.BrokerID)
			idOf[e.BrokerID] = e.ID
		case memory.EventAcked, memory.EventDeadLettered:
			if e.Kind == memory.EventDeadLettered && e.Consumer == "" {
				continue // the broker gave up on it; no consumer handled it
			}
			if !seen[e.BrokerID] {
				seen[e.BrokerID] = true
				settled = append(settled, e.BrokerID)
			}
		}
	}
	ids := func(bids []string) []string {
		out := make([]string, len(bids))
		for i, bid := range bids {
			out[i] = idOf[bid]
		}
		return out
	}
	byKey := func(e memory.Event) bool { return e.Key == key }
	if len(published) == 0 {
		t.Fatalf("memorytest: %s: no message with key %q was published", dest, key)
	}
	if strings.Join(published, "\x00") != strings.Join(settled, "\x00") {
		t.Fatalf("memorytest: %s: key %q: published %q but settled %q (broker IDs %q, %q); history of the key:%s", dest, key, ids(published), ids(settled), published, settled, describe(evs, byKey))
	}
	return ids(settled)
}

// RequireCommitted fails the test unless group's committed offset of
// partition on topic is offset.
func RequireCommitted(t testing.TB, b *memory.Broker, topic, group string, partition int32, offset int64) {
	t.Helper()
	c, err := b.Committed(topic, group)
	if err != nil {
		t.Fatalf("memorytest: %v", err)
	}
	if partition < 0 || int(partition) >= len(c) || c[partition] != offset {
		t.Fatalf("memorytest: %s/%s: committed offsets %v, want partition %d at %d", topic, group, c, partition, offset)
	}
}

// RequireEmpty fails the test unless the queue dest holds no message (none
// visible, delayed or in flight).
func RequireEmpty(t testing.TB, b *memory.Broker, dest string) {
	t.Helper()
	msgs, err := b.Messages(dest)
	if err != nil {
		t.Fatalf("memorytest: %v", err)
	}
	if len(msgs) > 0 {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.ID
		}
		t.Fatalf("memorytest: %s holds %d messages: %q", dest, len(msgs), ids)
	}
}

// WaitFor waits until cond holds for dest's history (see
// memory.Broker.WaitHistory for what cond may do) and fails the test,
// mentioning what, after DefaultTimeout.
func WaitFor(t testing.TB, b *memory.Broker, dest, what string, cond func(events []memory.Event) bool) {
	t.Helper()
	ctx, cancel := timeout(t)
	defer cancel()
	if err := b.WaitHistory(ctx, dest, cond); err != nil {
		evs, _ := b.History(dest)
		t.Fatalf("memorytest: %s: waiting for %s: %v; last events:%s", dest, what, err, describe(tail(evs, 20), func(memory.Event) bool { return true }))
	}
}

func tail(evs []memory.Event, n int) []memory.Event {
	if len(evs) > n {
		return evs[len(evs)-n:]
	}
	return evs
}

func waitEvent(t testing.TB, b *memory.Broker, dest, what string, match func(memory.Event) bool) memory.Event {
	t.Helper()
	var got memory.Event
	ctx, cancel := timeout(t)
	defer cancel()
	from := 0 // the history only grows: scan each event once
	err := b.WaitHistory(ctx, dest, func(evs []memory.Event) bool {
		if from > len(evs) {
			from = 0 // dest was deleted and created again: a new history
		}
		for _, e := range evs[from:] {
			if match(e) {
				got = e
				return true
			}
		}
		from = len(evs)
		return false
	})
	if err != nil {
		evs, _ := b.History(dest)
		t.Fatalf("memorytest: %s: waiting for %s: %v; last events:%s", dest, what, err, describe(tail(evs, 20), func(memory.Event) bool { return true }))
	}
	return got
}

// WaitForAcked waits until the message id is acked on dest and returns the
// ack event.
func WaitForAcked(t testing.TB, b *memory.Broker, dest, id string) memory.Event {
	t.Helper()
	return waitEvent(t, b, dest, fmt.Sprintf("ack of %q", id), func(e memory.Event) bool {
		return e.Kind == memory.EventAcked && e.ID == id
	})
}

// WaitForAckCount waits until n acks were recorded on dest (acks of
// duplicates and redeliveries count). When dest is deleted and created
// again it counts the acks of the new destination.
func WaitForAckCount(t testing.TB, b *memory.Broker, dest string, n int) {
	t.Helper()
	WaitFor(t, b, dest, fmt.Sprintf("%d acks", n), ackCounter(n))
}

// ackCounter returns WaitForAckCount's condition: it is called with the
// growing history of dest and counts only the events it has not seen yet.
func ackCounter(n int) func([]memory.Event) bool {
	seen, from := 0, 0
	return func(evs []memory.Event) bool {
		if from > len(evs) {
			seen, from = 0, 0 // dest was deleted and created again: a new history
		}
		for _, e := range evs[from:] {
			if e.Kind == memory.EventAcked {
				seen++
			}
		}
		from = len(evs)
		return seen >= n
	}
}

// WaitForDelivered waits until the message id is delivered on dest as
// attempt attempt (any attempt when attempt is 0) and returns the delivery
// event.
func WaitForDelivered(t testing.TB, b *memory.Broker, dest, id string, attempt int) memory.Event {
	t.Helper()
	return waitEvent(t, b, dest, fmt.Sprintf("delivery %d of %q", attempt, id), func(e memory.Event) bool {
		return e.Kind == memory.EventDelivered && e.ID == id && (attempt == 0 || e.Attempt == attempt)
	})
}

// WaitForNacked waits until the message id is nacked on dest and returns the
// nack event (its Delay is the delay asked for). A test using a
// memory.VirtualClock advances the clock by that delay next.
func WaitForNacked(t testing.TB, b *memory.Broker, dest, id string) memory.Event {
	t.Helper()
	return waitEvent(t, b, dest, fmt.Sprintf("nack of %q", id), func(e memory.Event) bool {
		return e.Kind == memory.EventNacked && e.ID == id
	})
}

// WaitForDeadLettered waits until the message id is dead-lettered from dest
// with reason (any when empty) and returns the dead letter.
func WaitForDeadLettered(t testing.TB, b *memory.Broker, dest, id string, reason dlq.Reason) DeadLetter {
	t.Helper()
	e := waitEvent(t, b, dest, fmt.Sprintf("dead-lettering of %q (reason %q)", id, reason), func(e memory.Event) bool {
		return e.Kind == memory.EventDeadLettered && e.ID == id && (reason == "" || e.Reason == reason)
	})
	return deadLetter(t, b, e)
}

// WaitForCommitted waits until group's committed offset of partition on
// topic reaches at least offset. It reads the committed offset itself, so an
// offset the group started at (which no commit event records) counts; it
// checks again after each new event of topic.
func WaitForCommitted(t testing.TB, b *memory.Broker, topic, group string, partition int32, offset int64) {
	t.Helper()
	ctx, cancel := timeout(t)
	defer cancel()
	reached := func() bool {
		c, err := b.Committed(topic, group)
		return err == nil && partition >= 0 && int(partition) < len(c) && c[partition] >= offset
	}
	seen := -1
	for !reached() {
		// Every change of a committed offset records an event (a commit,
		// or the rebalance of a group's creation): wait for the next one.
		err := b.WaitHistory(ctx, topic, func(evs []memory.Event) bool {
			if len(evs) != seen {
				seen = len(evs)
				return true
			}
			return false
		})
		if err != nil {
			evs, _ := b.History(topic)
			c, _ := b.Committed(topic, group)
			t.Fatalf("memorytest: %s: waiting for commit of %s partition %d at %d (committed %v): %v; last events:%s", topic, group, partition, offset, c, err, describe(tail(evs, 20), func(memory.Event) bool { return true }))
		}
	}
}

// WaitForTimer waits until clk has a timer pending that fires d or more
// from now (memory.VirtualClock.WaitForTimer): the timer the test expects,
// such as the engine's retry in place after ackwise.RetryAfter(err, d),
// however many other timers are pending (the engine's lease heartbeat).
// It fails the test after DefaultTimeout.
func WaitForTimer(t testing.TB, clk *memory.VirtualClock, d time.Duration) {
	t.Helper()
	ctx, cancel := timeout(t)
	defer cancel()
	if err := clk.WaitForTimer(ctx, d); err != nil {
		t.Fatalf("memorytest: waiting for a timer of %v or more (%d timers pending): %v", d, clk.Pending(), err)
	}
}

// Inject puts f in force on dest and removes it when the test ends. It fails
// the test for an invalid fault.
func Inject(t testing.TB, b *memory.Broker, dest string, f memory.Fault) *memory.InjectedFault {
	t.Helper()
	x, err := b.InjectFault(dest, f)
	if err != nil {
		t.Fatalf("memorytest: %v", err)
	}
	t.Cleanup(x.Remove)
	return x
}
