package memory_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/dlq"
)

func TestFaultCrashBeforeAckQueue(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{Lease: time.Minute})
	x, err := src.InjectFault(memory.Fault{Kind: memory.FaultCrashBeforeAck, Match: func(m *ackwise.Message) bool { return m.ID == "b" }})
	if err != nil {
		t.Fatal(err)
	}
	tb.publish(t, "q", msg("a", ""), msg("b", ""), msg("c", ""))
	ms := recv(t, src, 3)
	if err := src.Ack(tb.ctx, ms[0]); err != nil {
		t.Fatal(err)
	}
	if err := src.Ack(tb.ctx, ms[1]); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("Ack(b) = %v, want ErrCrashed", err)
	}
	if x.Fired() != 1 {
		t.Fatalf("fired %d", x.Fired())
	}
	// Everything after the crash fails; nothing is valid.
	if err := src.Ack(tb.ctx, ms[2]); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("Ack(c) = %v", err)
	}
	if _, err := src.Receive(tb.ctx, make([]*ackwise.Message, 1)); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("Receive = %v", err)
	}
	if src.Valid(ms[2]) {
		t.Fatal("valid after crash")
	}
	memorytest.RequireAcked(t, tb.b, "q", "a")
	memorytest.RequireNotAcked(t, tb.b, "q", "b")
	// A restarted consumer gets b and c after their lease.
	next, err := tb.b.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	requireNothing(t, next)
	tb.clk.Advance(time.Minute)
	if g := fmt.Sprint(ids(recv(t, next, 2))); g != "[b c]" && g != "[c b]" {
		t.Fatalf("after restart %s", g)
	}
}

func TestFaultCrashBeforeSettleOnDeadLetterLog(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	a := tb.member(t, "ev", "g")
	memorytest.Inject(t, tb.b, "ev", memory.Fault{Kind: memory.FaultCrashBeforeSettle, Count: 1})
	tb.publish(t, "ev", msg("x", ""))
	m := recvOne(t, a)
	env := dlq.New(m, dlq.ReasonPermanent, errors.New("e"), ackwise.ClassPermanent, tb.clk.Now(), "c", "")
	if err := a.DeadLetter(tb.ctx, m, env); !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("DeadLetter = %v", err)
	}
	if _, err := tb.b.Messages("ev.dlq"); !errors.Is(err, memory.ErrNotFound) {
		t.Fatal("dead letter written although the consumer crashed before it")
	}
	b := tb.member(t, "ev", "g")
	if m := recvOne(t, b); m.ID != "x" || m.Attempt != 2 {
		t.Fatalf("re-read %+v", m)
	}
}

func TestFaultLoseAck(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{Lease: time.Second})
	memorytest.Inject(t, tb.b, "q", memory.Fault{Kind: memory.FaultLoseAck, Count: 1})
	tb.publish(t, "q", msg("a", ""))
	m := recvOne(t, src)
	if err := src.Ack(tb.ctx, m); err != nil {
		t.Fatalf("lost Ack = %v, want nil", err)
	}
	memorytest.RequireNotAcked(t, tb.b, "q", "a")
	tb.clk.Advance(time.Second)
	m = recvOne(t, src)
	if m.Attempt != 2 {
		t.Fatalf("attempt %d", m.Attempt)
	}
	if err := src.Ack(tb.ctx, m); err != nil {
		t.Fatal(err)
	}
	memorytest.RequireAcked(t, tb.b, "q", "a")
}

func TestFaultLoseAckLogNeverCommits(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	a := tb.member(t, "ev", "g")
	memorytest.Inject(t, tb.b, "ev", memory.Fault{Kind: memory.FaultLoseAck, Match: func(m *ackwise.Message) bool { return m.ID == "0" }})
	tb.publish(t, "ev", msg("0", ""), msg("1", ""))
	for _, m := range recv(t, a, 2) {
		if err := a.Ack(tb.ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 0)
	a.Close()
	b := tb.member(t, "ev", "g")
	if g := fmt.Sprint(ids(recv(t, b, 2))); g != "[0 1]" {
		t.Fatalf("re-read %s", g)
	}
}

func TestFaultFailAck(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{})
	boom := errors.New("boom")
	memorytest.Inject(t, tb.b, "q", memory.Fault{Kind: memory.FaultFailAck, Count: 1, Err: boom})
	tb.publish(t, "q", msg("a", ""))
	m := recvOne(t, src)
	if err := src.Ack(tb.ctx, m); !errors.Is(err, boom) {
		t.Fatalf("Ack = %v", err)
	}
	if !src.Valid(m) {
		t.Fatal("failed ack settled the message")
	}
	if err := src.Ack(tb.ctx, m); err != nil {
		t.Fatalf("second Ack = %v", err)
	}
}

func TestFaultEveryKth(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{})
	x, err := src.InjectFault(memory.Fault{Kind: memory.FaultFailAck, Every: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 9 {
		tb.publish(t, "q", msg(fmt.Sprint(i), ""))
	}
	var failed []string
	for _, m := range recv(t, src, 9) {
		if err := src.Ack(tb.ctx, m); errors.Is(err, memory.ErrInjected) {
			failed = append(failed, m.ID)
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if g := fmt.Sprint(failed); g != "[2 5 8]" || x.Fired() != 3 {
		t.Fatalf("failed %s, fired %d", g, x.Fired())
	}
	x.Remove()
	x.Remove()
}

func TestFaultDuplicate(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{})
	memorytest.Inject(t, tb.b, "q", memory.Fault{Kind: memory.FaultDuplicate, Count: 2})
	tb.publish(t, "q", msg("a", ""), msg("b", ""))
	// Buffer of one: the duplicate of a comes with the next Receive.
	first := recvOne(t, src)
	dup := recvOne(t, src)
	if first.ID != "a" || dup.ID != "a" || dup == first || dup.Attempt != first.Attempt {
		t.Fatalf("got %q and %q (attempts %d, %d)", first.ID, dup.ID, first.Attempt, dup.Attempt)
	}
	if !src.Valid(first) || !src.Valid(dup) {
		t.Fatal("duplicates not both valid")
	}
	if err := src.Ack(tb.ctx, dup); err != nil {
		t.Fatal(err)
	}
	if err := src.Ack(tb.ctx, first); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("Ack of the other copy = %v", err)
	}
	// With room, the duplicate follows in the same batch.
	buf := make([]*ackwise.Message, 4)
	n, err := src.Receive(tb.ctx, buf)
	if err != nil || fmt.Sprint(ids(buf[:n])) != "[b b]" {
		t.Fatalf("batch %v, %v", ids(buf[:n]), err)
	}
	memorytest.RequireDeliveries(t, tb.b, "q", "b", 2)
}

func TestFaultDuplicateLog(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.member(t, "ev", "g")
	if _, err := src.InjectFault(memory.Fault{Kind: memory.FaultDuplicate, Count: 1}); err != nil {
		t.Fatal(err)
	}
	tb.publish(t, "ev", msg("a", ""))
	ms := recv(t, src, 2)
	for _, m := range ms {
		if m.ID != "a" || m.Offset != 0 {
			t.Fatalf("got %+v", m)
		}
		if err := src.Ack(tb.ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 1)
	if st := mustStats(t, tb.b, "ev"); st.Acked != 1 {
		t.Fatalf("acked %d", st.Acked)
	}
}

// A duplicate that does not fit in the buffer waits for a later Receive. On
// a log it must not overtake a record of its partition with a lower offset
// released meanwhile: a real log's duplicates come from rewinds, in offset
// order, and a consumer ordering by key would see b before the a below it.
func TestFaultDuplicateLogKeepsOffsetOrder(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.member(t, "ev", "g")
	if _, err := src.InjectFault(memory.Fault{Kind: memory.FaultDuplicate, Count: 1, Match: func(m *ackwise.Message) bool { return m.ID == "b" }}); err != nil {
		t.Fatal(err)
	}
	tb.publish(t, "ev", msg("a", "k"), msg("b", "k"), msg("c", "k"))
	ms := recv(t, src, 2) // a, b: b's duplicate does not fit
	if g := fmt.Sprint(ids(ms)); g != "[a b]" {
		t.Fatalf("first batch %s", g)
	}
	if err := src.Release(tb.ctx, ms[0]); err != nil {
		t.Fatal(err)
	}
	buf := make([]*ackwise.Message, 8)
	n, err := src.Receive(tb.ctx, buf)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range buf[:n] {
		got = append(got, fmt.Sprintf("%s@%d#%d", m.ID, m.Offset, m.Attempt))
	}
	if g := fmt.Sprint(got); g != "[a@0#2 b@1#1 c@2#1]" {
		t.Fatalf("second batch %s, want a's redelivery, then b's duplicate, then c", g)
	}
	// The history tells the deliveries in the order they were handed out.
	evs, err := tb.b.History("ev")
	if err != nil {
		t.Fatal(err)
	}
	var delivered []string
	for _, e := range evs {
		if e.Kind == memory.EventDelivered {
			delivered = append(delivered, fmt.Sprintf("%s#%d", e.ID, e.Attempt))
		}
	}
	if g := fmt.Sprint(delivered); g != "[a#1 b#1 a#2 b#1 c#1]" {
		t.Fatalf("delivered events %s", g)
	}
	for _, m := range append(ms[1:], buf[:n]...) {
		if err := src.Ack(tb.ctx, m); err != nil {
			t.Fatalf("Ack(%s#%d): %v", m.ID, m.Attempt, err)
		}
	}
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 3)
}

// A duplicate still held back when its partition is reset is dropped with
// the partition's other unread deliveries: it was never handed out.
func TestFaultDuplicateLogDroppedOnReset(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.member(t, "ev", "g")
	if _, err := src.InjectFault(memory.Fault{Kind: memory.FaultDuplicate, Count: 1}); err != nil {
		t.Fatal(err)
	}
	tb.publish(t, "ev", msg("a", "k"))
	first := recvOne(t, src)
	if err := tb.b.SeekGroup("ev", "g", 0, memory.OffsetEarliest); err != nil {
		t.Fatal(err)
	}
	again := recvOne(t, src)
	if again.ID != "a" || again.Attempt != 2 || !src.Valid(again) || src.Valid(first) {
		t.Fatalf("after the reset got %s#%d (valid %v; first valid %v)", again.ID, again.Attempt, src.Valid(again), src.Valid(first))
	}
	requireNothing(t, src)
	memorytest.RequireDeliveries(t, tb.b, "ev", "a", 2)
}

func TestFaultReorder(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"queue", "log"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			tb := setup(t)
			var src adapters.Source
			if mode == "queue" {
				src = tb.queue(t, "d", memory.QueueConfig{})
			} else {
				src = tb.member(t, "d", "g")
			}
			memorytest.Inject(t, tb.b, "d", memory.Fault{Kind: memory.FaultReorder, Count: 1})
			tb.publish(t, "d", msg("1", "k"), msg("2", "k"), msg("3", "k"))
			if g := fmt.Sprint(ids(recv(t, src, 3))); g != "[3 2 1]" {
				t.Fatalf("got %s", g)
			}
			tb.publish(t, "d", msg("4", "k"), msg("5", "k"))
			if g := fmt.Sprint(ids(recv(t, src, 2))); g != "[4 5]" {
				t.Fatalf("after Count ran out: %s", g)
			}
		})
	}
}

func TestFaultFailPublish(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if err := tb.b.CreateQueue("q", memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	memorytest.Inject(t, tb.b, "q", memory.Fault{Kind: memory.FaultFailPublish, Count: 1, Match: func(m *ackwise.Message) bool { return m.ID == "b" }})
	err := tb.b.Publish(tb.ctx, "q", msg("a", ""), msg("b", ""), msg("c", ""))
	// b fails with the fault, c after it is not attempted; a is confirmed.
	pe, ok := errors.AsType[*adapters.PublishError](err)
	if !ok || len(pe.Failed) != 2 || pe.Failed[0].Index != 1 || !errors.Is(pe.Failed[0].Err, memory.ErrInjected) || pe.Failed[1].Index != 2 || errors.Is(pe.Failed[1].Err, memory.ErrInjected) {
		t.Fatalf("Publish = %v, want an adapters.PublishError listing b (injected) and c (not attempted)", err)
	}
	msgs, _ := tb.b.Messages("q")
	if g := fmt.Sprint(ids(msgs)); g != "[a]" {
		t.Fatalf("stored %s, want the messages before the failure", g)
	}
	// AfterStore: stored, but the confirmation is lost.
	memorytest.Inject(t, tb.b, "q", memory.Fault{Kind: memory.FaultFailPublish, Count: 1, AfterStore: true})
	if err := tb.b.Publish(tb.ctx, "q", msg("d", "")); !errors.Is(err, memory.ErrInjected) {
		t.Fatalf("Publish = %v", err)
	}
	msgs, _ = tb.b.Messages("q")
	if g := fmt.Sprint(ids(msgs)); g != "[a d]" {
		t.Fatalf("stored %s", g)
	}
}

func TestFaultHangPublish(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if err := tb.b.CreateQueue("q", memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	memorytest.Inject(t, tb.b, "q", memory.Fault{Kind: memory.FaultHangPublish, Count: 1})
	ctx, cancel := context.WithCancel(tb.ctx)
	errc := make(chan error, 1)
	go func() { errc <- tb.b.Publish(ctx, "q", msg("a", "")) }()
	memorytest.WaitFor(t, tb.b, "q", "the fault", func(evs []memory.Event) bool {
		return len(evs) > 0 && evs[len(evs)-1].Kind == memory.EventFault
	})
	select {
	case err := <-errc:
		t.Fatalf("Publish returned %v before ctx was done", err)
	default:
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Publish = %v", err)
	}
	if msgs, _ := tb.b.Messages("q"); len(msgs) != 0 {
		t.Fatalf("stored %v", ids(msgs))
	}
}

func TestFaultValidation(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{})
	for _, c := range []struct {
		f    memory.Fault
		want string
	}{
		{memory.Fault{}, "Fault.Kind = 0"},
		{memory.Fault{Kind: memory.FaultLoseAck, Count: -1}, "Fault.Count = -1"},
		{memory.Fault{Kind: memory.FaultLoseAck, Every: -2}, "Fault.Every = -2"},
		{memory.Fault{Kind: memory.FaultFailPublish}, "publish fault"},
	} {
		_, err := src.InjectFault(c.f)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("InjectFault(%+v) = %v, want %q", c.f, err, c.want)
		}
	}
	if _, err := tb.b.InjectFault("missing", memory.Fault{Kind: memory.FaultLoseAck}); !errors.Is(err, memory.ErrNotFound) {
		t.Errorf("InjectFault on missing = %v", err)
	}
}

func TestOutage(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{})
	tb.publish(t, "q", msg("a", ""))
	m := recvOne(t, src)

	errc := make(chan error, 1)
	go func() {
		_, err := src.Receive(tb.ctx, make([]*ackwise.Message, 1))
		errc <- err
	}()
	tb.b.Outage(time.Minute)
	if err := <-errc; !errors.Is(err, memory.ErrUnavailable) {
		t.Fatalf("blocked Receive = %v", err)
	}
	if err := tb.b.Publish(tb.ctx, "q", msg("b", "")); !errors.Is(err, memory.ErrUnavailable) {
		t.Fatalf("Publish = %v", err)
	}
	if err := src.Ack(tb.ctx, m); !errors.Is(err, memory.ErrUnavailable) {
		t.Fatalf("Ack = %v", err)
	}
	tb.clk.Advance(30 * time.Second)
	if _, err := src.Receive(tb.ctx, make([]*ackwise.Message, 1)); !errors.Is(err, memory.ErrUnavailable) {
		t.Fatalf("Receive = %v", err)
	}
	tb.clk.Advance(30 * time.Second)
	if err := tb.b.Publish(tb.ctx, "q", msg("b", "")); err != nil {
		t.Fatalf("Publish after the window = %v", err)
	}

	// An outage of one destination leaves the others alone.
	tb.publish(t, "other", msg("x", ""))
	tb.b.Outage(time.Minute, "other")
	if err := tb.b.Publish(tb.ctx, "q", msg("c", "")); err != nil {
		t.Fatal(err)
	}
	if err := tb.b.Publish(tb.ctx, "other", msg("c", "")); !errors.Is(err, memory.ErrUnavailable) {
		t.Fatalf("Publish to other in its outage = %v", err)
	}
	tb.b.Outage(time.Minute, "q")
	if err := tb.b.Publish(tb.ctx, "q", msg("d", "")); !errors.Is(err, memory.ErrUnavailable) {
		t.Fatalf("Publish to q in its outage = %v", err)
	}
	tb.b.Outage(0, "q")
	if err := tb.b.Publish(tb.ctx, "q", msg("d", "")); err != nil {
		t.Fatalf("Publish after ending the outage = %v", err)
	}
}

func TestOutageLog(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.member(t, "ev", "g")
	errc := make(chan error, 1)
	go func() {
		_, err := src.Receive(tb.ctx, make([]*ackwise.Message, 1))
		errc <- err
	}()
	tb.b.Outage(time.Second, "ev")
	if err := <-errc; !errors.Is(err, memory.ErrUnavailable) {
		t.Fatalf("blocked Receive = %v", err)
	}
}
