package memory_test

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
)

// relClock hides the VirtualClock's absolute-time scheduling, so the
// broker's wake-up timers go through AfterFunc and count for
// VirtualClock.WaitForTimers: a test can wait until a receiver armed its
// timer (which it does under the queue's lock, just before it blocks).
// A hook, when set, runs once inside the next Now, before it reads the
// clock; afterRead runs once inside the next Now, after it read the clock
// (the caller then goes on with a reading the hook made stale).
type relClock struct {
	vc        *memory.VirtualClock // not embedded: its absolute scheduling must not show
	hook      atomic.Pointer[func()]
	afterRead atomic.Pointer[func()]
}

func (c *relClock) Now() time.Time {
	if f := c.hook.Swap(nil); f != nil {
		(*f)()
	}
	now := c.vc.Now()
	if f := c.afterRead.Swap(nil); f != nil {
		(*f)()
	}
	return now
}

func (c *relClock) AfterFunc(d time.Duration, f func()) ackwise.Timer {
	return c.vc.AfterFunc(d, f)
}

func newRelBroker(t *testing.T) (*memory.Broker, *memory.VirtualClock, *relClock) {
	t.Helper()
	vc := memory.NewVirtualClock(time.Time{})
	rc := &relClock{vc: vc}
	b, err := memory.New(memory.Config{Clock: rc})
	if err != nil {
		t.Fatal(err)
	}
	return b, vc, rc
}

// A receiver blocked with its wake-up timer set at a lease deadline must be
// woken when ExtendLease brings that lease forward (or ends it at once): it
// must not sleep past the message becoming visible again.
func TestQueueExtendLeaseShorterWakesBlockedReceiver(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		dur     time.Duration
		advance time.Duration
	}{
		{"shorter", time.Second, time.Second},
		{"zero", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, vc, _ := newRelBroker(t)
			if err := b.CreateQueue("q", memory.QueueConfig{Lease: time.Hour}); err != nil {
				t.Fatal(err)
			}
			src, err := b.QueueSource("q")
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			memorytest.Publish(t, b, "q", msg("a", ""))
			m := recvOne(t, src)

			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			type result struct {
				m   *ackwise.Message
				err error
			}
			got := make(chan result, 1)
			go func() {
				buf := make([]*ackwise.Message, 1)
				_, err := src.Receive(ctx, buf)
				got <- result{buf[0], err}
			}()
			// The receiver armed its timer for the lease's end, an hour on.
			if err := vc.WaitForTimers(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if err := src.ExtendLease(ctx, m, tc.dur); err != nil {
				t.Fatal(err)
			}
			vc.Advance(tc.advance)
			r := <-got
			if r.err != nil {
				t.Fatalf("blocked Receive = %v; it slept past the shortened lease", r.err)
			}
			if r.m.ID != "a" || r.m.Attempt != 2 {
				t.Fatalf("got %q attempt %d", r.m.ID, r.m.Attempt)
			}
		})
	}
}

// A Close that lands while Receive is on its way in (after its first state
// check) must not lease messages to the closed source.
func TestQueueReceiveClosedMidwayLeasesNothing(t *testing.T) {
	t.Parallel()
	b, _, rc := newRelBroker(t)
	src, err := b.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	memorytest.Publish(t, b, "q", msg("a", ""))
	closeNow := func() { src.Close() }
	rc.hook.Store(&closeNow) // runs in Receive's clock reading
	n, err := src.Receive(context.Background(), make([]*ackwise.Message, 1))
	if n != 0 || !errors.Is(err, adapters.ErrClosed) {
		t.Fatalf("Receive on a source closed midway = %d, %v; want 0, ErrClosed", n, err)
	}
	if st := mustStats(t, b, "q"); st.InFlight != 0 || st.Ready != 1 {
		t.Fatalf("stats %+v: the message was leased to a closed source", st)
	}
}

// Leases, lease extensions and Nack delays too large for unix nanoseconds
// saturate instead of wrapping into the past (which made a message visible,
// and its delivery invalid, at once).
func TestQueueHugeDurationsDoNotOverflow(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	huge := time.Duration(math.MaxInt64)
	src := tb.queue(t, "q", memory.QueueConfig{Lease: huge})
	tb.publish(t, "q", msg("a", ""), msg("b", ""))
	ms := recv(t, src, 2)
	if !src.Valid(ms[0]) {
		t.Fatal("delivery with a huge lease is invalid at once")
	}
	if err := src.ExtendLease(tb.ctx, ms[0], huge); err != nil {
		t.Fatal(err)
	}
	if !src.Valid(ms[0]) {
		t.Fatal("delivery invalid after a huge ExtendLease")
	}
	if err := src.Ack(tb.ctx, ms[0]); err != nil {
		t.Fatalf("Ack = %v", err)
	}
	if err := src.Nack(tb.ctx, ms[1], huge); err != nil {
		t.Fatal(err)
	}
	if st := mustStats(t, tb.b, "q"); st.Delayed != 1 || st.Ready != 0 || st.Acked != 1 {
		t.Fatalf("stats %+v: want b delayed, a acked", st)
	}
}

// Receive leases a message from the time it takes it, not from a clock
// reading made before it took the queue's lock: a message published after
// the clock moved on (here by a whole lease) must not be handed out with a
// lease that already ran out, as if it had been delivered before it was
// published.
func TestQueueReceiveLeaseStartsWhenTaken(t *testing.T) {
	t.Parallel()
	b, vc, rc := newRelBroker(t)
	const lease = 30 * time.Second
	if err := b.CreateQueue("q", memory.QueueConfig{Lease: lease}); err != nil {
		t.Fatal(err)
	}
	src, err := b.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	// Runs inside Receive's first clock reading, after it read the time:
	// the clock moves on by a lease and a message is published then.
	moveOn := func() {
		vc.Advance(lease)
		memorytest.Publish(t, b, "q", msg("a", ""))
	}
	rc.afterRead.Store(&moveOn)
	m := recvOne(t, src)
	if !src.Valid(m) {
		t.Fatal("a message published and received at once is not valid: its lease started before it was published")
	}
	if err := src.Ack(context.Background(), m); err != nil {
		t.Fatalf("Ack right after Receive = %v", err)
	}
	evs, err := b.History("q")
	if err != nil {
		t.Fatal(err)
	}
	var published, delivered time.Time
	for _, e := range evs {
		switch e.Kind {
		case memory.EventPublished:
			published = e.Time
		case memory.EventDelivered:
			delivered = e.Time
		}
	}
	if delivered.Before(published) {
		t.Fatalf("delivered at %v, before it was published at %v", delivered, published)
	}
}

// An expiry's history event carries the time the lease ran out, not the
// time the broker next looked at the queue: with nobody receiving, that can
// be much later.
func TestQueueExpiredEventAtLeaseDeadline(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	src := tb.queue(t, "q", memory.QueueConfig{Lease: 10 * time.Second})
	tb.publish(t, "q", msg("a", ""))
	start := tb.clk.Now()
	recvOne(t, src)
	tb.clk.Advance(time.Hour)
	if m := recvOne(t, src); m.ID != "a" || m.Attempt != 2 {
		t.Fatalf("redelivery = %s attempt %d, want a attempt 2", m.ID, m.Attempt)
	}
	evs, err := tb.b.History("q")
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, e := range evs {
		if e.Kind != memory.EventExpired {
			continue
		}
		found = true
		if got := e.Time.Sub(start); got != 10*time.Second {
			t.Fatalf("expired event at start+%v, want start+10s (the lease's deadline): %v", got, e)
		}
	}
	if !found {
		t.Fatalf("no expired event in %v", evs)
	}
}
