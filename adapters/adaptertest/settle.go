package adaptertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// testLease checks leases where the source has them: a delivery whose lease
// is extended stays with its consumer past the original lease, and one whose
// lease runs out goes to another consumer, after which the first
// consumer's receipt no longer settles it (ErrReceiptInvalid, Valid false).
func testLease(t *testing.T, h Harness) {
	const lease = 2 * time.Second
	f := h.Open(t, FixtureConfig{Lease: lease})
	a := f.NewSource(t)
	caps := a.Capabilities()
	if caps.Lease == 0 {
		t.Skip("deliveries have no lease (Capabilities.Lease 0): a delivery stays with its consumer until settled or the consumer goes; checked by CrashBeforeAckRedelivers")
	}
	if caps.Lease > lease {
		t.Fatalf("Capabilities.Lease %v: the harness did not give the %v the case asked for", caps.Lease, lease)
	}
	in := batch(2, 2) // in[0]: its lease is extended; in[1]: left to run out
	h.publish(t, f, in)
	got := map[string]*ackwise.Message{}
	for len(got) < 2 {
		m := h.receiveOne(t, a)
		got[m.ID] = m
	}
	kept, lapsed := got[in[0].ID], got[in[1].ID]
	if kept == nil || lapsed == nil {
		t.Fatalf("received %v, want %s and %s", got, in[0].ID, in[1].ID)
	}

	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	stop := make(chan struct{})
	extended := make(chan error, 1)
	if caps.ExtendLease {
		go func() {
			tick := time.NewTicker(caps.Lease / 4)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					extended <- nil
					return
				case <-tick.C:
					if err := a.ExtendLease(ctx, kept, caps.Lease); err != nil {
						extended <- fmt.Errorf("ExtendLease: %w", err)
						return
					}
				}
			}
		}()
	} else {
		t.Log("the source cannot extend a lease (Capabilities.ExtendLease false): only expiry is checked")
	}

	// Another consumer gets the lapsed delivery once its lease ran out,
	// and not the one whose lease is being extended.
	b := f.NewSource(t)
	start := time.Now()
	again := h.receiveOne(t, b)
	if again.ID != lapsed.ID {
		t.Fatalf("the second consumer received %s, want %s (its lease ran out; %s's was extended)", again.ID, lapsed.ID, kept.ID)
	}
	if caps.ExtendLease {
		close(stop)
		if err := <-extended; err != nil {
			t.Fatal(err)
		}
		if !a.Valid(kept) {
			t.Fatalf("Valid(%s) false after its lease was extended", kept.ID)
		}
		if err := a.Ack(ctx, kept); err != nil {
			t.Fatalf("Ack of the delivery whose lease was extended: %v", err)
		}
	}
	// The first consumer may learn of the expiry a little after the broker
	// acted on it (its clock for the lease starts when the delivery
	// arrived), but not much later.
	for deadline := time.Now().Add(time.Second); a.Valid(lapsed); {
		if time.Now().After(deadline) {
			t.Fatalf("Valid(%s) still true a second after its lease ran out and it was delivered again", lapsed.ID)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition that has no signal
	}
	if err := a.Ack(ctx, lapsed); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("Ack with the receipt whose lease ran out: %v, want ErrReceiptInvalid", err)
	}
	if err := b.Ack(ctx, again); err != nil {
		t.Fatalf("Ack of the redelivery: %v", err)
	}
	// Both are settled: neither comes back within a lease and a half.
	requireNothingMore(ctx, t, b, caps.Lease*3/2, fmt.Sprintf("after both were acked; %v since the redelivery began", time.Since(start)))
}

// testExtendAfterSettle: the engine's heartbeat extends leases concurrently
// with settles, so an ExtendLease can reach the source after the message
// was settled. It must change nothing: a released (or nacked without
// delay) message is still delivered again at once, not held for the lease
// the late extension asked for, and an acked one never comes back.
func testExtendAfterSettle(t *testing.T, h Harness) {
	const lease = 2 * time.Second
	f := h.Open(t, FixtureConfig{Lease: lease})
	src := f.NewSource(t)
	caps := src.Capabilities()
	if !caps.ExtendLease {
		t.Skip("the source cannot extend a lease (Capabilities.ExtendLease false): nothing to check")
	}
	n := 2
	if caps.Delay {
		n = 3
	}
	in := batch(n, n)
	h.publish(t, f, in)
	got := map[string]*ackwise.Message{}
	for len(got) < n {
		m := h.receiveOne(t, src)
		got[m.ID] = m
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	acked, released := got[in[0].ID], got[in[1].ID]
	if err := src.Ack(ctx, acked); err != nil {
		t.Fatal(err)
	}
	if err := src.Release(ctx, released); err != nil {
		t.Fatal(err)
	}
	settled := []*ackwise.Message{acked, released}
	want := map[string]bool{released.ID: true}
	if caps.Delay {
		nacked := got[in[2].ID]
		if err := src.Nack(ctx, nacked, 0); err != nil {
			t.Fatal(err)
		}
		settled = append(settled, nacked)
		want[nacked.ID] = true
	}
	extendedAt := time.Now()
	for _, m := range settled {
		if err := src.ExtendLease(ctx, m, caps.Lease); err != nil && !errors.Is(err, adapters.ErrReceiptInvalid) {
			t.Fatalf("ExtendLease of settled %s: %v, want nil or ErrReceiptInvalid", m.ID, err)
		}
	}
	// The redeliveries come well before the extended lease would end.
	wait, cancelWait := context.WithTimeout(ctx, caps.Lease*3/4)
	defer cancelWait()
	buf := make([]*ackwise.Message, 1)
	for len(want) > 0 {
		k, err := src.Receive(wait, buf)
		if k == 0 {
			t.Fatalf("%v not delivered again %v after it was settled and then extended (err %v): the late extension held it", want, time.Since(extendedAt), err)
		}
		m := buf[0]
		if !want[m.ID] {
			t.Fatalf("received %s (attempt %d): it was acked before the late extension", m.ID, m.Attempt)
		}
		delete(want, m.ID)
		if err := src.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
}

// testSettleAfterClose: a consumer closed with deliveries in hand (a
// handler outlived the drain, the process is going down) can no longer
// settle them. Ack, Nack and DeadLetter fail rather than report a
// settlement Close already gave up; DeadLetter writes no dead letter and
// Nack no delayed copy; Release changes nothing (it is never an ack); and
// Valid is false. The next consumer gets every message, each once.
func testSettleAfterClose(t *testing.T, h Harness) {
	const tier = 200 * time.Millisecond
	f := h.Open(t, FixtureConfig{Lease: time.Second, DelayTiers: []time.Duration{tier}})
	src := f.NewSource(t)
	caps := src.Capabilities()
	in := batch(4, 4) // acked, released, nacked, dead-lettered
	h.publish(t, f, in)
	got := map[string]*ackwise.Message{}
	for len(got) < len(in) {
		m := h.receiveOne(t, src)
		got[m.ID] = m
	}
	if err := src.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	for _, m := range in {
		if src.Valid(got[m.ID]) {
			t.Errorf("Valid(%s) true after Close", m.ID)
		}
	}
	failed := func(op string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s after Close: nil, want an error (ErrReceiptInvalid or ErrClosed): the delivery was given up by Close", op)
		}
	}
	failed("Ack", src.Ack(ctx, got[in[0].ID]))
	if err := src.Release(ctx, got[in[1].ID]); err != nil {
		t.Logf("Release after Close: %v (allowed: the message comes back either way)", err)
	}
	if caps.Delay {
		failed("Nack", src.Nack(ctx, got[in[2].ID], tier))
	} else {
		t.Log("source cannot delay redelivery (Capabilities.Delay false): Nack after Close not checked")
	}
	failed("DeadLetter", src.DeadLetter(ctx, got[in[3].ID], dlq.New(got[in[3].ID], dlq.ReasonPermanent, errors.New("late"), ackwise.ClassPermanent, time.Now(), "late", "v0")))

	// Every message comes back to the next consumer, and once: a Nack that
	// wrote a delayed copy shows as a second delivery after the tier.
	next := f.NewSource(t)
	seen := map[string]int{}
	for len(seen) < len(in) {
		m := h.receiveOne(t, next)
		seen[m.ID]++
		if seen[m.ID] > 1 {
			t.Fatalf("%s delivered twice to the next consumer", m.ID)
		}
		if err := next.Ack(ctx, m); err != nil {
			t.Fatalf("ack %s: %v", m.ID, err)
		}
	}
	for _, m := range in {
		if seen[m.ID] == 0 {
			t.Fatalf("%s not delivered again after Close (seen %v)", m.ID, seen)
		}
	}
	requireNothingMore(ctx, t, next, 3*tier, "after every message was acked: a settle after Close left a copy")
	if dl := f.DeadLetters(ctx, t); len(dl) != 0 {
		t.Fatalf("%d dead letters after a DeadLetter that Close had voided, want none", len(dl))
	}
}

// testSecondSettle: each delivery is settled at most once. A second settle
// of the same delivery (a caller's bug: a Release then a DeadLetter, an Ack
// then a Release) must fail without acting: no dead letter written for a
// message handed back, and no harm to the other deliveries of the source
// (on RabbitMQ a second ack of a delivery tag closes the channel, and every
// other delivery on it is redelivered).
func testSecondSettle(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{Lease: 2 * time.Second})
	src := f.NewSource(t)
	in := batch(3, 3) // released then dead-lettered, acked then released, bystander
	h.publish(t, f, in)
	got := map[string]*ackwise.Message{}
	for len(got) < len(in) {
		m := h.receiveOne(t, src)
		got[m.ID] = m
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	released, acked, bystander := got[in[0].ID], got[in[1].ID], got[in[2].ID]
	if err := src.Release(ctx, released); err != nil {
		t.Fatal(err)
	}
	env := dlq.New(released, dlq.ReasonPermanent, errors.New("after release"), ackwise.ClassPermanent, time.Now(), "t", "v0")
	if err := src.DeadLetter(ctx, released, env); err == nil {
		t.Errorf("DeadLetter of %s after its Release: nil, want an error", released.ID)
	}
	if err := src.Ack(ctx, acked); err != nil {
		t.Fatal(err)
	}
	if err := src.Release(ctx, acked); err == nil {
		t.Errorf("Release of %s after its Ack: nil, want an error", acked.ID)
	}
	if err := src.Ack(ctx, bystander); err != nil {
		t.Fatalf("Ack of another delivery after the second settles: %v", err)
	}
	// The released message comes back (once), the others do not.
	again := h.receiveOne(t, src)
	if again.ID != released.ID {
		t.Fatalf("received %s, want %s again (the only one handed back)", again.ID, released.ID)
	}
	if err := src.Ack(ctx, again); err != nil {
		t.Fatal(err)
	}
	requireNothingMore(ctx, t, src, time.Second, "after every message was acked")
	if dl := f.DeadLetters(ctx, t); len(dl) != 0 {
		t.Fatalf("%d dead letters, want none: the DeadLetter after a Release acted", len(dl))
	}
}

// testReleaseNotOvertaken: the messages behind a released message of its
// key do not overtake its redelivery where the source promises order. The
// case receives the first of several messages of one key (the source may
// have fetched or prefetched the others meanwhile) and releases it. On an
// ordered source (Capabilities.Ordered) the next delivery is the released
// message, then the others in publish order, each once. A source that does
// not promise order may hand out what it already sent first (a RabbitMQ
// consumer's prefetch): there the released message comes back and each
// message is delivered once, in any order.
func testReleaseNotOvertaken(t *testing.T, h Harness) {
	const n = 5
	f := h.Open(t, FixtureConfig{})
	in := batch(n, 1) // one key: one partition, one FIFO group
	h.publish(t, f, in)
	src := f.NewSource(t)
	ordered := src.Capabilities().Ordered
	first := h.receiveOne(t, src)
	if ordered && first.ID != in[0].ID {
		t.Fatalf("first delivery %s, want %s (the source is Ordered)", first.ID, in[0].ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	if err := src.Release(ctx, first); err != nil {
		t.Fatalf("release: %v", err)
	}
	var order []string
	seen := map[string]bool{}
	for len(seen) < n {
		m := h.receiveOne(t, src)
		if seen[m.ID] {
			t.Fatalf("%s delivered twice after the release (order so far %v)", m.ID, order)
		}
		seen[m.ID] = true
		order = append(order, m.ID)
		if err := src.Ack(ctx, m); err != nil {
			t.Fatalf("ack %s: %v", m.ID, err)
		}
	}
	for _, m := range in {
		if !seen[m.ID] {
			t.Fatalf("%s not delivered after the release (got %v)", m.ID, order)
		}
	}
	if !ordered {
		t.Logf("source does not promise order (Capabilities.Ordered false): checked the released message comes back and each message comes once, not their order (received %v after releasing %s)", order, first.ID)
	} else {
		if want := ids(in); !slices.Equal(order, want) {
			t.Fatalf("after releasing %s received %v, want %v: a message behind the released one overtook it", first.ID, order, want)
		}
	}
	requireNothingMore(ctx, t, src, 500*time.Millisecond, "after every message was acked")
}

// invalidOnce is a source whose first Valid check says no, as when the
// delivery's partition was revoked or its channel died: the engine releases
// that message unrun. The check waits until the engine has received want
// messages, so that the others of its key wait behind it in its lane.
type invalidOnce struct {
	adapters.Source
	want     int64
	received atomic.Int64
	all      chan struct{} // closed once want messages were received
	once     sync.Once
	checked  atomic.Bool
	invalid  atomic.Pointer[string] // the ID of the message said no to
	gaveUp   atomic.Bool            // the check stopped waiting for all to be received
	timeout  time.Duration          // how long the check waits
}

func (s *invalidOnce) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	n, err := s.Source.Receive(ctx, buf)
	if s.received.Add(int64(n)) >= s.want {
		s.once.Do(func() { close(s.all) })
	}
	return n, err
}

func (s *invalidOnce) Valid(m *ackwise.Message) bool {
	if !s.checked.CompareAndSwap(false, true) {
		return s.Source.Valid(m)
	}
	id := m.ID
	s.invalid.Store(&id)
	select {
	case <-s.all:
	case <-time.After(s.timeout):
		s.gaveUp.Store(true)
	}
	return false
}

// Extensions drops Invalidator: invalidOnce's Valid says no where the
// wrapped source, which would tell the engine, says yes.
func (s *invalidOnce) Extensions() adapters.Extensions {
	ext := s.Source.Extensions()
	ext.Invalidator = nil
	return ext
}

// testReleasedLaneNotOvertaken: when the engine hands a message back to the
// broker unrun (here: its receipt is no longer valid) while the other
// messages of its key wait behind it in its lane, it releases them too,
// unrun, and the source delivers them again after it. On an ordered source
// the handler sees the key's messages in publish order, each once (the
// released message never ran before); on another, each once.
func testReleasedLaneNotOvertaken(t *testing.T, h Harness) {
	const n = 5
	f := h.Open(t, FixtureConfig{})
	in := batch(n, 1) // one key: one lane
	h.publish(t, f, in)
	src := &invalidOnce{Source: f.NewSource(t), want: n, all: make(chan struct{}), timeout: h.Timeout}
	ordered := src.Capabilities().Ordered
	rec := h.newRecorder(nil)
	_, stop := h.start(t, src, rec, consumer.Config{Concurrency: 4, MaxInFlight: 2 * n})
	rec.waitFor(t, "every message handled", func() bool { return len(rec.byID) == n })
	if err := stop(); err != nil {
		t.Fatalf("consumer: %v", err)
	}
	if src.gaveUp.Load() {
		t.Fatalf("the engine received %d of %d messages within %v", src.received.Load(), n, h.Timeout)
	}
	invalid := src.invalid.Load()
	if invalid == nil {
		t.Fatal("Valid was never called: the engine ran a handler without checking its receipt")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	got := ids(rec.seen)
	for id, k := range rec.byID {
		if k != 1 {
			t.Fatalf("%s handled %d times, want once (handled %v; %s was released unrun)", id, k, got, *invalid)
		}
	}
	if !ordered {
		t.Logf("source does not promise order (Capabilities.Ordered false): checked each message is handled once, not their order (handled %v; %s was released unrun)", got, *invalid)
		return
	}
	if *invalid != in[0].ID {
		t.Fatalf("first Valid check was of %s, want %s (the source is Ordered)", *invalid, in[0].ID)
	}
	if want := ids(in); !slices.Equal(got, want) {
		t.Fatalf("handled %v, want %v: a message behind the released %s overtook it", got, want, in[0].ID)
	}
}
