package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
)

// recyclingSource is a fakeSource that implements adapters.Recycler and
// reports every settle or lease call on a message already recycled (which,
// on a real recycling source, could be a later delivery of another record).
type recyclingSource struct {
	*fakeSource
	t *testing.T

	rmu      sync.Mutex
	recycled map[*ackwise.Message]int
	// onExtend, when set, runs at the start of ExtendLease.
	onExtend func(m *ackwise.Message)
}

func newRecyclingSource(t *testing.T, caps adapters.Capabilities, msgs ...*ackwise.Message) *recyclingSource {
	return &recyclingSource{fakeSource: newFakeSource(caps, msgs...), t: t, recycled: map[*ackwise.Message]int{}}
}

func (s *recyclingSource) Recycle(msgs ...*ackwise.Message) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for _, m := range msgs {
		s.recycled[m]++
		if s.recycled[m] > 1 {
			s.t.Errorf("%s recycled %d times", m.ID, s.recycled[m])
		}
	}
}

func (s *recyclingSource) Extensions() adapters.Extensions {
	return adapters.Extensions{Recycler: s}
}

func (s *recyclingSource) isRecycled(m *ackwise.Message) bool {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return s.recycled[m] > 0
}

func (s *recyclingSource) check(op string, m *ackwise.Message) {
	if s.isRecycled(m) {
		s.t.Errorf("%s of %s after it was recycled", op, m.ID)
	}
}

func (s *recyclingSource) ExtendLease(_ context.Context, m *ackwise.Message, _ time.Duration) error {
	if f := s.onExtend; f != nil {
		f(m)
	}
	s.check("ExtendLease", m)
	return nil
}

func (s *recyclingSource) Ack(ctx context.Context, m *ackwise.Message) error {
	s.check("Ack", m)
	return s.fakeSource.Ack(ctx, m)
}

func (s *recyclingSource) Release(ctx context.Context, m *ackwise.Message) error {
	s.check("Release", m)
	return s.fakeSource.Release(ctx, m)
}

var _ adapters.Recycler = (*recyclingSource)(nil)

// TestHeartbeatExtendsRecycledMessage: the heartbeat picks the
// messages due for a lease extension under the engine lock and extends them
// after releasing it. A message finished in between is recycled by then, so
// ExtendLease runs on a message the source may already have handed out again
// (the Recycler contract: nothing may use msg after Recycle).
func TestHeartbeatExtendsRecycledMessage(t *testing.T) {
	t.Parallel()
	clock := memory.NewVirtualClock(time.Time{})
	in := msgs(2, 2)
	src := newRecyclingSource(t, adapters.Capabilities{Delay: true, Lease: 3 * time.Second, ExtendLease: true}, in...)
	release := map[*ackwise.Message]chan struct{}{in[0]: make(chan struct{}), in[1]: make(chan struct{})}
	started := make(chan struct{}, 2)
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		started <- struct{}{}
		<-release[m]
		return nil
	})
	first := make(chan *ackwise.Message, 1)
	proceed := make(chan struct{})
	var once sync.Once
	src.onExtend = func(m *ackwise.Message) {
		once.Do(func() {
			first <- m
			<-proceed
		})
	}
	c, err := consumer.New(src, h, consumer.Config{Concurrency: 2, Clock: clock, DrainTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	consumer.PinPace(c, "single")
	stop := run(t, c)
	<-started
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		t.Fatal("heartbeat not armed")
	}
	clock.Advance(time.Second) // a third of the lease: both are due
	var extending *ackwise.Message
	select {
	case extending = <-first:
	case <-ctx.Done():
		t.Fatal("no lease extension")
	}
	other := in[0]
	if extending == in[0] {
		other = in[1]
	}
	// The other message finishes while the heartbeat extends the first.
	close(release[other])
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.InFlight == 1 }) {
		close(proceed)
		close(release[extending])
		t.Fatalf("other message not finished: %+v", c.Stats())
	}
	// Give a finisher that recycles at once (the bug) the time to do it. A
	// correct engine defers the recycle to the heartbeat, which waits on
	// proceed: there is no event to await, and this window runs out.
	for deadline := time.Now().Add(100 * time.Millisecond); !src.isRecycled(other) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	close(proceed) // the heartbeat goes on to the other message
	// Let the heartbeat finish its round before the last message ends: it
	// arms its next tick when the round is over.
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		close(release[extending])
		t.Fatal("heartbeat round never finished")
	}
	if !src.isRecycled(other) {
		close(release[extending])
		t.Fatal("the heartbeat's round ended without recycling the message that finished during it")
	}
	close(release[extending])
	if !src.waitSettled(2, 5*time.Second) {
		t.Fatalf("not settled: %+v", c.Stats())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Every message is recycled, the deferred one included.
	for deadline := time.Now().Add(5 * time.Second); !src.isRecycled(in[0]) || !src.isRecycled(in[1]); {
		if time.Now().After(deadline) {
			t.Fatal("a finished message was never recycled")
		}
		time.Sleep(time.Millisecond)
	}
}

// lateSource returns one message from a Receive that was already waiting
// when Run's context ended, after the drain began.
type lateSource struct {
	*recyclingSource
	late    *ackwise.Message
	entered chan struct{}
	c       *consumer.Consumer
}

func (s *lateSource) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	close(s.entered)
	<-ctx.Done()
	select { // the drain has begun
	case <-consumer.Drained(s.c):
	case <-time.After(5 * time.Second):
		s.t.Error("the drain never began after Run's context ended")
	}
	buf[0] = s.late
	s.mu.Lock()
	s.outstanding++
	s.mu.Unlock()
	return 1, nil
}

// TestRecycleMessageReceivedWhileStopping: the Recycler contract (and
// docs/adapters.md) says the engine recycles every message it received once
// it is done with it. A message received as Run was stopping is released at
// once and must be recycled too.
func TestRecycleMessageReceivedWhileStopping(t *testing.T) {
	t.Parallel()
	late := msgs(1, 1)[0]
	src := &lateSource{recyclingSource: newRecyclingSource(t, adapters.Capabilities{Delay: true}), late: late, entered: make(chan struct{})}
	c, err := consumer.New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil }), consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	src.c = c
	stop := run(t, c)
	<-src.entered
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	released := len(src.released)
	src.mu.Unlock()
	if released != 1 {
		t.Fatalf("released %d, want the late message released", released)
	}
	if !src.isRecycled(late) {
		t.Fatal("message received while stopping was released but never recycled")
	}
}
