package memory_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/dlq"
)

func TestQueuePublishReceiveAck(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "orders", memory.QueueConfig{})

	payload := []byte("hello")
	hdr := ackwise.HeadersOf("x", "1")
	tb.publish(t, "orders", &ackwise.Message{ID: "e1", Key: "k", Payload: payload, Headers: hdr})
	// The caller may reuse its buffers at once.
	payload[0] = 'J'
	hdr.Set("x", "2")

	m := recvOne(t, src)
	if m.ID != "e1" || m.Key != "k" || string(m.Payload) != "hello" {
		t.Fatalf("got %+v", m)
	}
	if m.Headers.Get("x") != "1" || m.Headers.Get(ackwise.HeaderEventID) != "e1" {
		t.Fatalf("headers = %v", m.Headers)
	}
	if m.Attempt != 1 || m.Source != "orders" || m.Partition != -1 || m.Offset != -1 || m.BrokerID == "" {
		t.Fatalf("delivery facts = %+v", m)
	}
	if !m.PublishedAt.Equal(memory.VirtualStart) {
		t.Fatalf("PublishedAt = %v", m.PublishedAt)
	}
	if !src.Valid(m) {
		t.Fatal("fresh delivery not valid")
	}
	if err := src.Ack(tb.ctx, m); err != nil {
		t.Fatal(err)
	}
	if src.Valid(m) {
		t.Fatal("acked delivery still valid")
	}
	if err := src.Ack(tb.ctx, m); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("second Ack = %v, want ErrReceiptInvalid", err)
	}
	memorytest.RequireAcked(t, tb.b, "orders", "e1")
	memorytest.RequireEmpty(t, tb.b, "orders")
	caps := src.Capabilities()
	if caps.Log || !caps.Delay || !caps.ExtendLease || !caps.DeliveryCount || caps.Ordered || caps.Lease != memory.DefaultLease {
		t.Fatalf("caps = %+v", caps)
	}
}

func TestQueueEmptyIDKeepsHeaders(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{})
	tb.publish(t, "q", &ackwise.Message{Payload: []byte("a")},
		&ackwise.Message{Headers: ackwise.HeadersOf(ackwise.HeaderEventID, "from-header")},
		&ackwise.Message{Payload: []byte{}})
	got := recv(t, src, 3)
	if got[0].ID != "" || got[0].Headers != nil {
		t.Fatalf("no ID: got ID %q headers %v", got[0].ID, got[0].Headers)
	}
	if got[1].ID != "from-header" {
		t.Fatalf("ID from header = %q", got[1].ID)
	}
	if got[1].Payload != nil || got[2].Payload == nil || len(got[2].Payload) != 0 {
		t.Fatalf("payload nil-ness not kept: %v %v", got[1].Payload, got[2].Payload)
	}
}

func TestQueueReceiveBlocksUntilPublish(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{})
	got := make(chan []string, 1)
	go func() {
		buf := make([]*ackwise.Message, 10)
		n, err := src.Receive(tb.ctx, buf)
		if err != nil {
			t.Error(err)
		}
		got <- ids(buf[:n])
	}()
	// Publish after the receiver is blocked (or not: either way it must
	// get the message).
	tb.publish(t, "q", msg("a", ""))
	if g := <-got; len(g) != 1 || g[0] != "a" {
		t.Fatalf("got %v", g)
	}
}

func TestQueueReceiveFillsUpToBuf(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{})
	for i := range 5 {
		tb.publish(t, "q", msg(fmt.Sprint(i), ""))
	}
	buf := make([]*ackwise.Message, 3)
	n, err := src.Receive(tb.ctx, buf)
	if err != nil || n != 3 {
		t.Fatalf("Receive = %d, %v", n, err)
	}
	if g := ids(buf[:n]); fmt.Sprint(g) != "[0 1 2]" {
		t.Fatalf("got %v", g)
	}
	if st := mustStats(t, tb.b, "q"); st.InFlight != 3 || st.Ready != 2 || st.Published != 5 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestQueueReceiveCancelAndClose(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{})
	ctx, cancel := context.WithCancel(tb.ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := src.Receive(ctx, make([]*ackwise.Message, 1))
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Receive = %v", err)
	}

	go func() {
		_, err := src.Receive(tb.ctx, make([]*ackwise.Message, 1))
		errc <- err
	}()
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, adapters.ErrClosed) {
		t.Fatalf("Receive after Close = %v", err)
	}
	if _, err := src.Receive(tb.ctx, make([]*ackwise.Message, 1)); !errors.Is(err, adapters.ErrClosed) {
		t.Fatalf("Receive on closed = %v", err)
	}
	if err := src.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
}

func TestQueueLeaseExpiryRedelivers(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{Lease: 10 * time.Second})
	tb.publish(t, "q", msg("a", ""))
	m1 := recvOne(t, src)
	requireNothing(t, src)

	tb.clk.Advance(9 * time.Second)
	if !src.Valid(m1) {
		t.Fatal("delivery invalid before its lease ran out")
	}
	requireNothing(t, src)

	// A receiver blocked now is woken by the broker's timer when the lease
	// runs out.
	got := make(chan *ackwise.Message, 1)
	go func() {
		buf := make([]*ackwise.Message, 1)
		if _, err := src.Receive(tb.ctx, buf); err != nil {
			t.Error(err)
		}
		got <- buf[0]
	}()
	tb.clk.Advance(time.Second)
	m2 := <-got
	if m2.ID != "a" || m2.Attempt != 2 {
		t.Fatalf("redelivery = %q attempt %d", m2.ID, m2.Attempt)
	}
	if src.Valid(m1) {
		t.Fatal("expired delivery still valid")
	}
	if err := src.Ack(tb.ctx, m1); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("Ack of expired delivery = %v", err)
	}
	if err := src.Ack(tb.ctx, m2); err != nil {
		t.Fatal(err)
	}
	memorytest.WaitFor(t, tb.b, "q", "expiry", func(evs []memory.Event) bool {
		for _, e := range evs {
			if e.Kind == memory.EventExpired && e.ID == "a" && e.Attempt == 1 {
				return true
			}
		}
		return false
	})
	memorytest.RequireDeliveries(t, tb.b, "q", "a", 2)
}

func TestQueueAckAfterLeaseRanOutFails(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{Lease: time.Second})
	tb.publish(t, "q", msg("a", ""))
	m := recvOne(t, src)
	tb.clk.Advance(time.Second)
	// Not received again yet, but the lease is gone.
	if src.Valid(m) {
		t.Fatal("valid after lease")
	}
	if err := src.Ack(tb.ctx, m); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("Ack = %v", err)
	}
	if m2 := recvOne(t, src); m2.Attempt != 2 {
		t.Fatalf("attempt = %d", m2.Attempt)
	}
}

func TestQueueNackDelay(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{})
	tb.publish(t, "q", msg("a", ""), msg("b", ""))
	ms := recv(t, src, 2)
	if err := src.Ack(tb.ctx, ms[1]); err != nil {
		t.Fatal(err)
	}
	if err := src.Nack(tb.ctx, ms[0], 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if src.Valid(ms[0]) {
		t.Fatal("nacked delivery still valid")
	}
	if err := src.Ack(tb.ctx, ms[0]); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("Ack after Nack = %v", err)
	}
	ev := memorytest.WaitForNacked(t, tb.b, "q", "a")
	if ev.Delay != 10*time.Minute || ev.Attempt != 1 {
		t.Fatalf("nack event = %v", ev)
	}
	if st := mustStats(t, tb.b, "q"); st.Delayed != 1 || st.InFlight != 0 || st.Acked != 1 {
		t.Fatalf("stats = %+v", st)
	}
	tb.clk.Advance(10*time.Minute - time.Nanosecond)
	requireNothing(t, src)
	tb.clk.Advance(time.Nanosecond)
	m := recvOne(t, src)
	if m.ID != "a" || m.Attempt != 2 {
		t.Fatalf("after delay: %q attempt %d", m.ID, m.Attempt)
	}
	if !m.FirstFailure.Equal(memory.VirtualStart) {
		t.Fatalf("FirstFailure = %v, want the first nack's time", m.FirstFailure)
	}
	if err := src.Nack(tb.ctx, m, 0); err != nil {
		t.Fatal(err)
	}
	if m := recvOne(t, src); m.ID != "a" || m.Attempt != 3 {
		t.Fatalf("after Nack(0): %q attempt %d", m.ID, m.Attempt)
	}
}

func TestQueueNackWakesBlockedReceiverAtDeadline(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{Lease: time.Hour})
	tb.publish(t, "q", msg("a", ""))
	m := recvOne(t, src)
	got := make(chan *ackwise.Message, 1)
	go func() {
		buf := make([]*ackwise.Message, 1)
		if _, err := src.Receive(tb.ctx, buf); err != nil {
			t.Error(err)
		}
		got <- buf[0]
	}()
	if err := src.Nack(tb.ctx, m, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	memorytest.WaitForNacked(t, tb.b, "q", "a")
	tb.clk.Advance(5 * time.Second)
	if m := <-got; m.Attempt != 2 {
		t.Fatalf("attempt %d", m.Attempt)
	}
}

func TestQueueExtendLease(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{Lease: 10 * time.Second})
	tb.publish(t, "q", msg("a", ""))
	m := recvOne(t, src)
	tb.clk.Advance(8 * time.Second)
	if err := src.ExtendLease(tb.ctx, m, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	tb.clk.Advance(8 * time.Second) // 16s after delivery: past the original lease
	requireNothing(t, src)
	if !src.Valid(m) {
		t.Fatal("extended delivery invalid")
	}
	tb.clk.Advance(2 * time.Second)
	if src.Valid(m) {
		t.Fatal("valid after extended lease")
	}
	if err := src.ExtendLease(tb.ctx, m, time.Minute); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("ExtendLease after expiry = %v", err)
	}
	if m2 := recvOne(t, src); m2.Attempt != 2 {
		t.Fatalf("attempt %d", m2.Attempt)
	}
}

func TestQueueRelease(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{})
	tb.publish(t, "q", msg("a", ""))
	m := recvOne(t, src)
	if err := src.Release(tb.ctx, m); err != nil {
		t.Fatal(err)
	}
	if src.Valid(m) {
		t.Fatal("released delivery valid")
	}
	m2 := recvOne(t, src) // no clock advance needed
	if m2.ID != "a" || m2.Attempt != 2 {
		t.Fatalf("got %q attempt %d", m2.ID, m2.Attempt)
	}
	memorytest.WaitFor(t, tb.b, "q", "release", func(evs []memory.Event) bool {
		for _, e := range evs {
			if e.Kind == memory.EventReleased {
				return true
			}
		}
		return false
	})
}

func TestQueueMaxReceivesRedrive(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{Lease: time.Second, MaxReceives: 3})
	tb.publish(t, "q", &ackwise.Message{ID: "a", Payload: []byte{0, 1, 2}, Headers: ackwise.HeadersOf("h", "v")})
	for attempt := 1; attempt <= 3; attempt++ {
		m := recvOne(t, src)
		if m.ID != "a" || m.Attempt != attempt {
			t.Fatalf("delivery: %q attempt %d, want a attempt %d", m.ID, m.Attempt, attempt)
		}
		if err := src.Nack(tb.ctx, m, 0); err != nil {
			t.Fatal(err)
		}
	}
	// The 4th receive moves a to the DLQ and hands out b instead.
	tb.publish(t, "q", msg("b", ""))
	if m := recvOne(t, src); m.ID != "b" {
		t.Fatalf("got %q, want b", m.ID)
	}
	dl := memorytest.WaitForDeadLettered(t, tb.b, "q", "a", dlq.ReasonMaxAttempts)
	if dl.Event.Envelope != nil || dl.Event.To != "q.dlq" || dl.Event.Attempt != 3 {
		t.Fatalf("dead-letter event = %v", dl.Event)
	}
	if dl.Message == nil || !bytes.Equal(dl.Message.Payload, []byte{0, 1, 2}) || dl.Message.Headers.Get("h") != "v" || dl.Message.Headers.Get(dlq.HeaderReason) != "" {
		t.Fatalf("dead letter = %+v", dl.Message)
	}
	if st := mustStats(t, tb.b, "q"); st.DeadLettered != 1 {
		t.Fatalf("stats = %+v", st)
	}
	// The DLQ is an ordinary queue.
	dsrc, err := tb.b.QueueSource("q.dlq")
	if err != nil {
		t.Fatal(err)
	}
	defer dsrc.Close()
	if m := recvOne(t, dsrc); m.ID != "a" || m.Attempt != 1 {
		t.Fatalf("from DLQ: %q attempt %d", m.ID, m.Attempt)
	}
}

func TestQueueMaxReceivesAfterLeaseExpiry(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{Lease: time.Second, MaxReceives: 1, DeadLetter: "parking"})
	tb.publish(t, "q", msg("a", ""))
	recvOne(t, src)
	tb.clk.Advance(time.Second)
	requireNothing(t, src) // the receive moved it instead of delivering it
	memorytest.RequireDeadLettered(t, tb.b, "q", "a", dlq.ReasonMaxAttempts)
	msgs, err := tb.b.Messages("parking")
	if err != nil || len(msgs) != 1 || msgs[0].ID != "a" {
		t.Fatalf("parking = %v, %v", msgs, err)
	}
}

func TestQueueDeadLetter(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "orders", memory.QueueConfig{})
	payload := []byte{0xff, 0x00, 'x'}
	tb.publish(t, "orders", &ackwise.Message{ID: "e1", Key: "k", Payload: payload, Headers: ackwise.HeadersOf("traceparent", "00-abc")})
	m := recvOne(t, src)
	env := dlq.New(m, dlq.ReasonPermanent, errors.New("bad payload"), ackwise.ClassPermanent, tb.clk.Now(), "billing", "v1")
	if err := src.DeadLetter(tb.ctx, m, env); err != nil {
		t.Fatal(err)
	}
	if src.Valid(m) {
		t.Fatal("dead-lettered delivery still valid")
	}
	dl := memorytest.RequireDeadLettered(t, tb.b, "orders", "e1", dlq.ReasonPermanent)
	if dl.Envelope.Error != "bad payload" || dl.Envelope.Consumer != "billing" {
		t.Fatalf("envelope = %+v", dl.Envelope)
	}
	got := dl.Message
	if got == nil || !bytes.Equal(got.Payload, payload) || got.Key != "k" || got.ID != "e1" {
		t.Fatalf("dead letter = %+v", got)
	}
	if got.Headers.Get("traceparent") != "00-abc" || got.Headers.Get(ackwise.HeaderEventID) != "e1" {
		t.Fatalf("original headers lost: %v", got.Headers)
	}
	dec, err := dlq.Decode(got.Headers)
	if err != nil || dec.Reason != dlq.ReasonPermanent || dec.Source != "orders" || dec.Attempts != 1 || dec.MessageID != m.BrokerID {
		t.Fatalf("decoded envelope = %+v, %v", dec, err)
	}
	memorytest.RequireNotAcked(t, tb.b, "orders", "e1")
	memorytest.RequireEmpty(t, tb.b, "orders")
}

func TestQueueDeadLetterFailsWhenDLQRefuses(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{})
	if err := tb.b.CreateQueue("q.dlq", memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	memorytest.Inject(t, tb.b, "q.dlq", memory.Fault{Kind: memory.FaultFailPublish, Count: 1})
	tb.publish(t, "q", msg("a", ""))
	m := recvOne(t, src)
	env := dlq.New(m, dlq.ReasonPermanent, errors.New("x"), ackwise.ClassPermanent, tb.clk.Now(), "c", "")
	if err := src.DeadLetter(tb.ctx, m, env); !errors.Is(err, memory.ErrInjected) {
		t.Fatalf("DeadLetter = %v, want ErrInjected", err)
	}
	// Move before ack: the message is still in flight, not lost.
	if !src.Valid(m) {
		t.Fatal("message settled although the move failed")
	}
	if err := src.DeadLetter(tb.ctx, m, env); err != nil {
		t.Fatal(err)
	}
	memorytest.RequireDeadLettered(t, tb.b, "q", "a", dlq.ReasonPermanent)
}

func TestQueueCompetingConsumers(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	const n = 2000
	if err := tb.b.CreateQueue("q", memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]string{}
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(tb.ctx)
	defer cancel()
	for range 3 {
		src, err := tb.b.QueueSource("q")
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer src.Close()
			buf := make([]*ackwise.Message, 7)
			for {
				k, err := src.Receive(ctx, buf)
				if err != nil {
					return
				}
				for _, m := range buf[:k] {
					mu.Lock()
					if prev, dup := seen[m.ID]; dup {
						t.Errorf("%s delivered to %s and %s", m.ID, prev, src.ID())
					}
					seen[m.ID] = src.ID()
					mu.Unlock()
					if err := src.Ack(ctx, m); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	for i := range n {
		tb.publish(t, "q", msg(fmt.Sprint(i), ""))
	}
	memorytest.WaitForAckCount(t, tb.b, "q", n)
	cancel()
	wg.Wait()
	consumers := map[string]int{}
	for _, c := range seen {
		consumers[c]++
	}
	if len(seen) != n {
		t.Fatalf("%d distinct messages, want %d", len(seen), n)
	}
	t.Logf("per consumer: %v", consumers)
	memorytest.RequireEmpty(t, tb.b, "q")
}

func TestQueueFIFOGroups(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "f", memory.QueueConfig{FIFO: true, Lease: time.Minute})
	if !src.Capabilities().Ordered {
		t.Fatal("FIFO queue not Ordered")
	}
	tb.publish(t, "f", msg("a1", "A"), msg("a2", "A"), msg("b1", "B"), msg("a3", "A"), msg("b2", "B"))

	// One in flight per key: only a1 and b1 are deliverable.
	buf := make([]*ackwise.Message, 10)
	n, err := src.Receive(tb.ctx, buf)
	if err != nil {
		t.Fatal(err)
	}
	if g := fmt.Sprint(ids(buf[:n])); g != "[a1 b1]" {
		t.Fatalf("first batch %s", g)
	}
	a1, b1 := buf[0], buf[1]
	requireNothing(t, src)

	// A nacked head holds back its key, not the others.
	if err := src.Nack(tb.ctx, a1, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := src.Ack(tb.ctx, b1); err != nil {
		t.Fatal(err)
	}
	if m := recvOne(t, src); m.ID != "b2" {
		t.Fatalf("got %q, want b2", m.ID)
	} else if err := src.Ack(tb.ctx, m); err != nil {
		t.Fatal(err)
	}
	requireNothing(t, src)
	tb.clk.Advance(time.Minute)
	a1 = recvOne(t, src)
	if a1.ID != "a1" || a1.Attempt != 2 {
		t.Fatalf("got %q attempt %d", a1.ID, a1.Attempt)
	}
	// Lease expiry also keeps the order.
	tb.clk.Advance(time.Minute)
	a1 = recvOne(t, src)
	if a1.ID != "a1" || a1.Attempt != 3 {
		t.Fatalf("got %q attempt %d", a1.ID, a1.Attempt)
	}
	for _, want := range []string{"a2", "a3"} {
		if err := src.Ack(tb.ctx, a1); err != nil {
			t.Fatal(err)
		}
		a1 = recvOne(t, src)
		if a1.ID != want {
			t.Fatalf("got %q, want %s", a1.ID, want)
		}
	}
	if err := src.Ack(tb.ctx, a1); err != nil {
		t.Fatal(err)
	}
	memorytest.RequireHandledInOrder(t, tb.b, "f", "A")
	memorytest.RequireHandledInOrder(t, tb.b, "f", "B")
	memorytest.RequireEmpty(t, tb.b, "f")
}

func TestQueueFIFOWakesReceiverWhenKeyFrees(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "f", memory.QueueConfig{FIFO: true})
	tb.publish(t, "f", msg("a1", "A"), msg("a2", "A"))
	a1 := recvOne(t, src)
	got := make(chan string, 1)
	go func() {
		buf := make([]*ackwise.Message, 1)
		if _, err := src.Receive(tb.ctx, buf); err != nil {
			t.Error(err)
		}
		got <- buf[0].ID
	}()
	if err := src.Ack(tb.ctx, a1); err != nil {
		t.Fatal(err)
	}
	if g := <-got; g != "a2" {
		t.Fatalf("got %q", g)
	}
}

func TestQueueFIFOMaxReceivesFreesKey(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "f", memory.QueueConfig{FIFO: true, MaxReceives: 1})
	tb.publish(t, "f", msg("a1", "A"), msg("a2", "A"))
	if err := src.Nack(tb.ctx, recvOne(t, src), 0); err != nil {
		t.Fatal(err)
	}
	if m := recvOne(t, src); m.ID != "a2" {
		t.Fatalf("got %q, want a2 after a1 was dead-lettered", m.ID)
	}
	memorytest.RequireDeadLettered(t, tb.b, "f", "a1", dlq.ReasonMaxAttempts)
}

// countingClock hides the VirtualClock's absolute scheduling, so that every
// broker timer goes through AfterFunc and is counted.
type countingClock struct{ vc *memory.VirtualClock }

func (c countingClock) Now() time.Time { return c.vc.Now() }

func (c countingClock) AfterFunc(d time.Duration, f func()) ackwise.Timer {
	return c.vc.AfterFunc(d, f)
}

func TestQueueOneTimerPerQueue(t *testing.T) {
	t.Parallel()
	clk := memory.NewVirtualClock(time.Time{})
	b, err := memory.New(memory.Config{Clock: countingClock{clk}})
	if err != nil {
		t.Fatal(err)
	}
	src, err := b.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for i := range 100 {
		memorytest.Publish(t, b, "q", msg(fmt.Sprint(i), ""))
	}
	ms := recv(t, src, 100)
	for i, m := range ms[:50] {
		if err := src.Nack(context.Background(), m, time.Duration(i+1)*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// A receiver blocks with 100 deadlines pending: one timer.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		src.Receive(ctx, make([]*ackwise.Message, 1))
	}()
	if err := clk.WaitForTimers(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	if p := clk.Pending(); p != 1 {
		t.Fatalf("%d timers pending, want 1", p)
	}
	// No receiver, no new timer: publishing and settling arm nothing.
	for _, m := range ms[50:] {
		if err := src.Ack(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	if p := clk.Pending(); p != 1 {
		t.Fatalf("%d timers pending, want 1", p)
	}
}

func TestQueueForeignMessage(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	a := tb.queue(t, "q", memory.QueueConfig{})
	b, err := tb.b.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	tb.publish(t, "q", msg("x", ""))
	m := recvOne(t, a)
	if b.Valid(m) {
		t.Fatal("other source's delivery valid")
	}
	if err := b.Ack(tb.ctx, m); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("Ack by other source = %v", err)
	}
	if err := a.Ack(tb.ctx, &ackwise.Message{ID: "forged"}); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("Ack of forged message = %v", err)
	}
}

func TestQueueCloseLeavesUnsettledToLease(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{Lease: time.Minute})
	tb.publish(t, "q", msg("a", ""))
	m := recvOne(t, src)
	src.Close()
	if src.Valid(m) {
		t.Fatal("valid after Close")
	}
	if err := src.Ack(tb.ctx, m); !errors.Is(err, adapters.ErrClosed) {
		t.Fatalf("Ack after Close = %v", err)
	}
	next, err := tb.b.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	requireNothing(t, next)
	tb.clk.Advance(time.Minute)
	if m := recvOne(t, next); m.Attempt != 2 {
		t.Fatalf("attempt %d", m.Attempt)
	}
}

func TestCreateConflicts(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if err := tb.b.CreateQueue("q", memory.QueueConfig{Lease: time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := tb.b.CreateQueue("q", memory.QueueConfig{Lease: time.Second}); err != nil {
		t.Fatalf("same config again: %v", err)
	}
	if err := tb.b.CreateQueue("q", memory.QueueConfig{Lease: time.Minute}); !errors.Is(err, memory.ErrConflict) {
		t.Fatalf("other config: %v", err)
	}
	if err := tb.b.CreateTopic("q", memory.TopicConfig{}); !errors.Is(err, memory.ErrConflict) {
		t.Fatalf("topic over queue: %v", err)
	}
	if _, err := tb.b.JoinGroup("q", "g"); !errors.Is(err, memory.ErrConflict) {
		t.Fatalf("JoinGroup on queue: %v", err)
	}
	if err := tb.b.CreateQueue("", memory.QueueConfig{}); err == nil {
		t.Fatal("empty name accepted")
	}
	if err := tb.b.CreateQueue("neg", memory.QueueConfig{Lease: -time.Second}); err == nil || !bytes.Contains([]byte(err.Error()), []byte("Lease = -1s")) {
		t.Fatalf("negative lease: %v", err)
	}
	if _, err := memory.New(memory.Config{Topic: memory.TopicConfig{Partitions: -1}}); err == nil || !bytes.Contains([]byte(err.Error()), []byte("Config.Topic.Partitions = -1")) {
		t.Fatalf("bad config: %v", err)
	}
	if _, err := tb.b.Stats("nope"); !errors.Is(err, memory.ErrNotFound) {
		t.Fatalf("Stats of missing: %v", err)
	}
}

func TestDeleteClosesSources(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{})
	sink, err := tb.b.Sink("q")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := src.Receive(tb.ctx, make([]*ackwise.Message, 1))
		errc <- err
	}()
	tb.b.Delete("q")
	if err := <-errc; !errors.Is(err, adapters.ErrClosed) {
		t.Fatalf("Receive after Delete = %v", err)
	}
	if err := sink.Publish(tb.ctx, msg("a", "")); !errors.Is(err, memory.ErrNotFound) {
		t.Fatalf("Publish after Delete = %v", err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestSinkClosed(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	sink, err := tb.b.Sink("q")
	if err != nil {
		t.Fatal(err)
	}
	if sink.Name() != "q" {
		t.Fatalf("Name = %q", sink.Name())
	}
	sink.Close()
	if err := sink.Publish(tb.ctx, msg("a", "")); !errors.Is(err, adapters.ErrClosed) {
		t.Fatalf("Publish after Close = %v", err)
	}
	s2, _ := tb.b.Sink("q")
	if err := s2.Publish(tb.ctx, nil); err == nil {
		t.Fatal("nil message accepted")
	}
}

// On the system clock Valid compares with the broker's last clock reading
// (taken by Receive); Ack reads the clock and is exact.
func TestQueueValidOnSystemClock(t *testing.T) {
	t.Parallel()
	b, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CreateQueue("q", memory.QueueConfig{Lease: time.Nanosecond}); err != nil {
		t.Fatal(err)
	}
	src, err := b.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	memorytest.Publish(t, b, "q", msg("a", ""))
	m := recvOne(t, src)
	if !src.Valid(m) {
		t.Fatal("not valid against the reading of its own Receive")
	}
	if err := src.Ack(context.Background(), m); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("Ack after a 1ns lease = %v", err)
	}
	m2 := recvOne(t, src) // this Receive sees the lease ran out
	if m2.Attempt != 2 || src.Valid(m) {
		t.Fatalf("redelivery attempt %d, first delivery valid %v", m2.Attempt, src.Valid(m))
	}
}

// Ack's fast path (system clock, no history, no outage) judges the lease by
// the last Receive's clock reading; a message received again is never acked
// through its old delivery.
func TestQueueAckFastPath(t *testing.T) {
	t.Parallel()
	b, err := memory.New(memory.Config{DisableHistory: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CreateQueue("q", memory.QueueConfig{Lease: time.Nanosecond}); err != nil {
		t.Fatal(err)
	}
	a, _ := b.QueueSource("q")
	other, _ := b.QueueSource("q")
	defer a.Close()
	defer other.Close()
	ctx := context.Background()
	memorytest.Publish(t, b, "q", msg("x", ""), msg("y", ""))
	ms := recv(t, a, 2)
	// Nobody received x again: its ack is taken although 1ns passed.
	if err := a.Ack(ctx, ms[0]); err != nil {
		t.Fatalf("Ack = %v", err)
	}
	// y is received again by the other consumer: the old delivery is dead.
	if m := recvOne(t, other); m.ID != "y" || m.Attempt != 2 {
		t.Fatalf("other got %q attempt %d", m.ID, m.Attempt)
	}
	if err := a.Ack(ctx, ms[1]); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("Ack of re-received message = %v", err)
	}
	if st := mustStats(t, b, "q"); st.Acked != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestQueueCrash(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{Lease: time.Second})
	tb.publish(t, "q", msg("a", ""))
	m := recvOne(t, src)
	errc := make(chan error, 1)
	go func() {
		_, err := src.Receive(tb.ctx, make([]*ackwise.Message, 1))
		errc <- err
	}()
	src.Crash()
	if err := <-errc; !errors.Is(err, memory.ErrCrashed) {
		t.Fatalf("blocked Receive = %v", err)
	}
	for name, err := range map[string]error{
		"Ack":         src.Ack(tb.ctx, m),
		"Nack":        src.Nack(tb.ctx, m, 0),
		"Release":     src.Release(tb.ctx, m),
		"ExtendLease": src.ExtendLease(tb.ctx, m, time.Minute),
	} {
		if !errors.Is(err, memory.ErrCrashed) {
			t.Errorf("%s after crash = %v", name, err)
		}
	}
	memorytest.WaitFor(t, tb.b, "q", "the crash", func(evs []memory.Event) bool {
		return evs[len(evs)-1].Kind == memory.EventCrashed
	})
	tb.clk.Advance(time.Second)
	next, err := tb.b.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if m := recvOne(t, next); m.Attempt != 2 {
		t.Fatalf("attempt %d", m.Attempt)
	}
}

// A broker whose implicit queues share one dead-letter queue (Config.Queue
// with DeadLetter set): that queue, created implicitly too, does not
// dead-letter into itself (an explicit QueueConfig saying so is refused)
// but into its name + ".dlq", and so on down its chain, never back up; a
// queue whose name merely starts like the chain keeps the shared one.
func TestSharedDeadLetterChain(t *testing.T) {
	t.Parallel()
	for queue, want := range map[string]string{
		"dead":             "dead.dlq",
		"dead.dlq":         "dead.dlq.dlq",
		"dead.dlq-archive": "dead",
	} {
		t.Run(queue, func(t *testing.T) {
			t.Parallel()
			clk := memory.NewVirtualClock(time.Time{})
			b, err := memory.New(memory.Config{Clock: clk, Queue: memory.QueueConfig{DeadLetter: "dead", MaxReceives: 1, Lease: time.Second}})
			if err != nil {
				t.Fatal(err)
			}
			src, err := b.QueueSource(queue)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { src.Close() })
			memorytest.Publish(t, b, queue, msg("a", ""))
			recvOne(t, src)
			clk.Advance(time.Second) // its lease ran out: its one receive is spent
			requireNothing(t, src)
			memorytest.RequireDeadLettered(t, b, queue, "a", dlq.ReasonMaxAttempts)
			msgs, err := b.Messages(want)
			if err != nil || len(msgs) != 1 || msgs[0].ID != "a" {
				t.Fatalf("%s = %v, %v: want the dead letter there", want, msgs, err)
			}
		})
	}
}
