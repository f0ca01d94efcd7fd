package memorytest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/dlq"
)

// recorder is a testing.TB whose Fatalf records the failure and ends the
// helper's goroutine, so a test can check that a helper fails.
type recorder struct {
	testing.TB
	msg      string
	deadline time.Time
}

func (r *recorder) Helper()                      {}
func (r *recorder) Cleanup(func())               {}
func (r *recorder) Deadline() (time.Time, bool)  { return r.deadline, true }
func (r *recorder) Fatalf(f string, args ...any) { r.msg = fmt.Sprintf(f, args...); runtime.Goexit() }
func (r *recorder) Errorf(f string, args ...any) { r.msg = fmt.Sprintf(f, args...) }
func (r *recorder) Fatal(args ...any)            { r.msg = fmt.Sprint(args...); runtime.Goexit() }
func (r *recorder) Logf(string, ...any)          {}
func (r *recorder) Name() string                 { return "recorder" }

// mustFail runs f with a recorder and returns its failure message; it fails
// t when f did not fail.
func mustFail(t *testing.T, f func(tb testing.TB)) string {
	t.Helper()
	r := &recorder{TB: t, deadline: time.Now().Add(1100 * time.Millisecond)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	if r.msg == "" {
		t.Fatal("helper did not fail")
	}
	return r.msg
}

type bundle struct {
	b   *memory.Broker
	clk *memory.VirtualClock
	ctx context.Context
}

func setup(t *testing.T) *bundle {
	b, clk := memorytest.NewBroker(t)
	if !clk.Now().Equal(memory.VirtualStart) || b.Clock() != clk {
		t.Fatal("NewBroker: not on a fresh virtual clock")
	}
	return &bundle{b: b, clk: clk, ctx: context.Background()}
}

func TestAckHelpers(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src, err := tb.b.QueueSource("orders")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	memorytest.Publish(t, tb.b, "orders", memorytest.Msg("e1", "k", "a"), memorytest.Msg("e2", "k", "b"))
	ms := memorytest.Receive(t, src, 2)
	if err := src.Ack(tb.ctx, ms[0]); err != nil {
		t.Fatal(err)
	}
	ev := memorytest.RequireAcked(t, tb.b, "orders", "e1")
	if ev.Consumer != src.ID() || ev.Attempt != 1 {
		t.Fatalf("ack event %v", ev)
	}
	memorytest.RequireNotAcked(t, tb.b, "orders", "e2")
	memorytest.RequireDeliveries(t, tb.b, "orders", "e1", 1)

	msg := mustFail(t, func(tb2 testing.TB) { memorytest.RequireAcked(tb2, tb.b, "orders", "e2") })
	if !strings.Contains(msg, `"e2" was not acked`) || !strings.Contains(msg, "delivered") {
		t.Fatalf("failure message %q", msg)
	}
	mustFail(t, func(tb2 testing.TB) { memorytest.RequireNotAcked(tb2, tb.b, "orders", "e1") })
	mustFail(t, func(tb2 testing.TB) { memorytest.RequireDeliveries(tb2, tb.b, "orders", "e1", 2) })
	mustFail(t, func(tb2 testing.TB) { memorytest.RequireEmpty(tb2, tb.b, "orders") })
	mustFail(t, func(tb2 testing.TB) { memorytest.RequireHandledInOrder(tb2, tb.b, "orders", "k") })

	// WaitForAcked is woken by the ack, not by polling.
	done := make(chan memory.Event)
	go func() { done <- memorytest.WaitForAcked(t, tb.b, "orders", "e2") }()
	if err := src.Ack(tb.ctx, ms[1]); err != nil {
		t.Fatal(err)
	}
	if ev := <-done; ev.ID != "e2" {
		t.Fatalf("event %v", ev)
	}
	memorytest.WaitForAckCount(t, tb.b, "orders", 2)
	memorytest.RequireHandledInOrder(t, tb.b, "orders", "k")
	memorytest.RequireEmpty(t, tb.b, "orders")

	msg = mustFail(t, func(tb2 testing.TB) { memorytest.WaitForAcked(tb2, tb.b, "orders", "never") })
	if !strings.Contains(msg, "deadline exceeded") {
		t.Fatalf("timeout message %q", msg)
	}
}

func TestHandledInOrderDetectsReorder(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src, err := tb.b.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	memorytest.Publish(t, tb.b, "q", memorytest.Msg("1", "k", ""), memorytest.Msg("2", "k", ""))
	ms := memorytest.Receive(t, src, 2)
	src.Ack(tb.ctx, ms[1])
	src.Ack(tb.ctx, ms[0])
	msg := mustFail(t, func(tb2 testing.TB) { memorytest.RequireHandledInOrder(tb2, tb.b, "q", "k") })
	if !strings.Contains(msg, `published ["1" "2"] but settled ["2" "1"]`) {
		t.Fatalf("message %q", msg)
	}
	mustFail(t, func(tb2 testing.TB) { memorytest.RequireHandledInOrder(tb2, tb.b, "q", "nokey") })
}

func TestDeadLetterHelpers(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src, err := tb.b.QueueSource("orders")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	memorytest.Publish(t, tb.b, "orders", memorytest.Msg("e1", "k", "body"))
	m := memorytest.Receive(t, src, 1)[0]
	done := make(chan memorytest.DeadLetter)
	go func() { done <- memorytest.WaitForDeadLettered(t, tb.b, "orders", "e1", dlq.ReasonPermanent) }()
	env := dlq.New(m, dlq.ReasonPermanent, errors.New("nope"), ackwise.ClassPermanent, tb.clk.Now(), "svc", "1.0")
	if err := src.DeadLetter(tb.ctx, m, env); err != nil {
		t.Fatal(err)
	}
	dl := <-done
	if dl.Envelope.Error != "nope" || dl.Message == nil || string(dl.Message.Payload) != "body" {
		t.Fatalf("dead letter %+v", dl)
	}
	dl = memorytest.RequireDeadLettered(t, tb.b, "orders", "e1", "")
	if dl.Message.Headers.Get(dlq.HeaderConsumer) != "svc" {
		t.Fatalf("headers %v", dl.Message.Headers)
	}
	mustFail(t, func(tb2 testing.TB) {
		memorytest.RequireDeadLettered(tb2, tb.b, "orders", "e1", dlq.ReasonMaxAttempts)
	})
	mustFail(t, func(tb2 testing.TB) { memorytest.RequireNotDeadLettered(tb2, tb.b, "orders", "e1") })
	memorytest.RequireHandledInOrder(t, tb.b, "orders", "k")
}

func TestNackAndDeliveryWaits(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src, err := tb.b.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	memorytest.Publish(t, tb.b, "q", memorytest.Msg("e", "", ""))
	m := memorytest.Receive(t, src, 1)[0]
	go func() {
		if err := src.Nack(context.Background(), m, 10*time.Minute); err != nil {
			t.Error(err)
		}
	}()
	ev := memorytest.WaitForNacked(t, tb.b, "q", "e")
	if nacks := memorytest.RequireNacked(t, tb.b, "q", "e"); len(nacks) != 1 || nacks[0].Delay != 10*time.Minute {
		t.Fatalf("nacks %v", nacks)
	}
	mustFail(t, func(tb2 testing.TB) { memorytest.RequireNacked(tb2, tb.b, "q", "other") })
	tb.clk.Advance(ev.Delay)
	got := make(chan *ackwise.Message)
	go func() { got <- memorytest.Receive(t, src, 1)[0] }()
	if ev := memorytest.WaitForDelivered(t, tb.b, "q", "e", 2); ev.Attempt != 2 {
		t.Fatalf("event %v", ev)
	}
	if m := <-got; m.Attempt != 2 {
		t.Fatalf("attempt %d", m.Attempt)
	}
	var kinds []string
	for _, e := range memorytest.Events(t, tb.b, "q", "e") {
		kinds = append(kinds, e.Kind.String())
	}
	if got := strings.Join(kinds, " "); got != "published delivered nacked delivered" {
		t.Fatalf("events %s", got)
	}
}

func TestCommitHelpers(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src, err := tb.b.JoinGroup("ev", "g")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	memorytest.Publish(t, tb.b, "ev", memorytest.Msg("a", "", ""))
	m := memorytest.Receive(t, src, 1)[0]
	mustFail(t, func(tb2 testing.TB) { memorytest.RequireCommitted(tb2, tb.b, "ev", "g", 0, 1) })
	mustFail(t, func(tb2 testing.TB) { memorytest.RequireCommitted(tb2, tb.b, "ev", "g", -1, 0) }) // panicked
	go src.Ack(tb.ctx, m)
	memorytest.WaitForCommitted(t, tb.b, "ev", "g", 0, 1)
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 1)
}

func TestInject(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if err := tb.b.CreateQueue("q", memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	var x *memory.InjectedFault
	t.Run("scoped", func(t *testing.T) {
		x = memorytest.Inject(t, tb.b, "q", memory.Fault{Kind: memory.FaultFailPublish})
		if err := tb.b.Publish(tb.ctx, "q", memorytest.Msg("a", "", "")); !errors.Is(err, memory.ErrInjected) {
			t.Fatalf("Publish = %v", err)
		}
	})
	// Removed when the subtest ended.
	memorytest.Publish(t, tb.b, "q", memorytest.Msg("b", "", ""))
	if x.Fired() != 1 {
		t.Fatalf("fired %d", x.Fired())
	}
	mustFail(t, func(tb2 testing.TB) { memorytest.Inject(tb2, tb.b, "q", memory.Fault{}) })
}

func TestHistoryDisabled(t *testing.T) {
	t.Parallel()
	b, err := memory.New(memory.Config{DisableHistory: true})
	if err != nil {
		t.Fatal(err)
	}
	memorytest.Publish(t, b, "q", memorytest.Msg("a", "", ""))
	msg := mustFail(t, func(tb testing.TB) { memorytest.RequireAcked(tb, b, "q", "a") })
	if !strings.Contains(msg, "history is disabled") {
		t.Fatalf("message %q", msg)
	}
}

func TestWaitBeforeTheTopicExists(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		memorytest.WaitForCommitted(t, tb.b, "late", "g", 0, 1)
	}()
	// Waiting did not create "late" as a queue: it can still be a topic.
	if err := tb.b.CreateTopic("late", memory.TopicConfig{}); err != nil {
		t.Fatal(err)
	}
	src, err := tb.b.JoinGroup("late", "g")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	memorytest.Publish(t, tb.b, "late", memorytest.Msg("a", "", ""))
	if err := src.Ack(tb.ctx, memorytest.Receive(t, src, 1)[0]); err != nil {
		t.Fatal(err)
	}
	<-done
}

// The broker's own redrive after MaxReceives is not a consumer handling the
// message: a key whose first message was never handled (its leases ran out
// until the broker gave up) must fail RequireHandledInOrder.
func TestHandledInOrderIgnoresBrokerRedrive(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if err := tb.b.CreateQueue("f", memory.QueueConfig{FIFO: true, MaxReceives: 1, Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	src, err := tb.b.QueueSource("f")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	memorytest.Publish(t, tb.b, "f", memorytest.Msg("a", "k", ""), memorytest.Msg("b", "k", ""))
	if m := memorytest.Receive(t, src, 1)[0]; m.ID != "a" {
		t.Fatalf("got %q, want a", m.ID)
	}
	// The consumer never settles a: its lease runs out and, MaxReceives used
	// up, the next Receive has the broker move it to f.dlq and deliver b.
	tb.clk.Advance(time.Minute)
	m := memorytest.Receive(t, src, 1)[0]
	if m.ID != "b" {
		t.Fatalf("got %q, want b", m.ID)
	}
	if err := src.Ack(tb.ctx, m); err != nil {
		t.Fatal(err)
	}
	memorytest.RequireDeadLettered(t, tb.b, "f", "a", dlq.ReasonMaxAttempts)
	msg := mustFail(t, func(tb2 testing.TB) { memorytest.RequireHandledInOrder(tb2, tb.b, "f", "k") })
	if !strings.Contains(msg, `published ["a" "b"] but settled ["b"]`) {
		t.Fatalf("message %q", msg)
	}
}

// A producer that retries after a lost confirmation stores the same event ID
// twice (at-least-once); a consumer that settles every stored copy in order
// handled the key in order, and one that leaves a copy unsettled did not.
func TestHandledInOrderWithDuplicatePublish(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if err := tb.b.CreateQueue("f", memory.QueueConfig{FIFO: true}); err != nil {
		t.Fatal(err)
	}
	src, err := tb.b.QueueSource("f")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	memorytest.Inject(t, tb.b, "f", memory.Fault{Kind: memory.FaultFailPublish, AfterStore: true, Count: 1})
	if err := tb.b.Publish(tb.ctx, "f", memorytest.Msg("a", "k", "")); !errors.Is(err, memory.ErrInjected) {
		t.Fatalf("publish: %v", err)
	}
	memorytest.Publish(t, tb.b, "f", memorytest.Msg("a", "k", ""), memorytest.Msg("b", "k", ""))

	m := memorytest.Receive(t, src, 1)[0]
	if err := src.Ack(tb.ctx, m); err != nil {
		t.Fatal(err)
	}
	msg := mustFail(t, func(tb2 testing.TB) { memorytest.RequireHandledInOrder(tb2, tb.b, "f", "k") })
	if !strings.Contains(msg, `published ["a" "a" "b"] but settled ["a"]`) {
		t.Fatalf("message %q", msg)
	}
	for range 2 {
		m := memorytest.Receive(t, src, 1)[0]
		if err := src.Ack(tb.ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if got := fmt.Sprint(memorytest.RequireHandledInOrder(t, tb.b, "f", "k")); got != "[a a b]" {
		t.Fatalf("order %s", got)
	}
}

// A group starts at its partitions' first retained offsets without a commit
// event; WaitForCommitted must see that offset as reached (RequireCommitted
// does), not wait for an event that never comes.
func TestWaitForCommittedStartingOffset(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if err := tb.b.CreateTopic("ev", memory.TopicConfig{Retention: 2}); err != nil {
		t.Fatal(err)
	}
	memorytest.Publish(t, tb.b, "ev", memorytest.Msg("1", "", ""), memorytest.Msg("2", "", ""), memorytest.Msg("3", "", ""))
	src, err := tb.b.JoinGroup("ev", "g")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 1)
	memorytest.WaitForCommitted(t, tb.b, "ev", "g", 0, 1)
	memorytest.WaitForCommitted(t, tb.b, "ev", "g", 0, 0)

	// It still waits for a commit to come, and fails when none does.
	done := make(chan struct{})
	go func() {
		defer close(done)
		memorytest.WaitForCommitted(t, tb.b, "ev", "g", 0, 2)
	}()
	m := memorytest.Receive(t, src, 1)[0]
	if err := src.Ack(tb.ctx, m); err != nil {
		t.Fatal(err)
	}
	<-done
	msg := mustFail(t, func(tb2 testing.TB) { memorytest.WaitForCommitted(tb2, tb.b, "ev", "g", 0, 3) })
	if !strings.Contains(msg, "deadline exceeded") {
		t.Fatalf("message %q", msg)
	}
}
