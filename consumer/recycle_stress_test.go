package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// stressHandler fails some calls, transient or permanent, and slows some
// down (a slow handler: the pace changes), in a fixed pattern; with panics,
// every 101st call panics.
func stressHandler(panics bool) ackwise.Handler {
	var calls atomic.Int64
	return ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		c := calls.Add(1)
		switch c % 17 {
		case 3:
			return errors.New("transient")
		case 5:
			return ackwise.Permanent(errors.New("bad"))
		case 7:
			time.Sleep(30 * time.Microsecond)
		}
		if panics && c%101 == 0 {
			panic("boom")
		}
		return nil
	})
}

// newReuseSource is a reuseSource of caps handing out total messages.
func newReuseSource(t *testing.T, caps adapters.Capabilities, total int) *reuseSource {
	s := &reuseSource{t: t, caps: caps, live: map[*ackwise.Message]bool{}, settled: map[*ackwise.Message]bool{}, total: total}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// reuseSource hands out messages from a free list of recycled ones, and
// poisons a message on recycle.
type reuseSource struct {
	t                      *testing.T
	caps                   adapters.Capabilities
	mu                     sync.Mutex
	cond                   *sync.Cond
	free                   []*ackwise.Message
	live                   map[*ackwise.Message]bool // delivered, not recycled
	settled                map[*ackwise.Message]bool
	next                   int
	total                  int
	closed                 bool
	acks, nacks, dead, rel atomic.Int64
}

func (s *reuseSource) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.next >= s.total && ctx.Err() == nil {
		s.cond.Wait()
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	n := 0
	for n < len(buf) && s.next < s.total {
		var m *ackwise.Message
		if k := len(s.free); k > 0 {
			m = s.free[k-1]
			s.free = s.free[:k-1]
		} else {
			m = new(ackwise.Message)
		}
		i := s.next
		s.next++
		*m = ackwise.Message{ID: fmt.Sprintf("e%d", i), Key: fmt.Sprintf("k%d", i%13), Payload: []byte(fmt.Sprint(i)), Partition: -1, Offset: -1, Attempt: 1, Handle: i}
		s.live[m] = true
		s.settled[m] = false
		buf[n] = m
		n++
	}
	return n, nil
}

func (s *reuseSource) use(op string, m *ackwise.Message, settle bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.live[m] {
		s.t.Errorf("%s on a recycled message %q", op, m.ID)
		return
	}
	if settle {
		if s.settled[m] {
			s.t.Errorf("%s of %s settled twice", op, m.ID)
		}
		s.settled[m] = true
	}
}

func (s *reuseSource) Ack(_ context.Context, m *ackwise.Message) error {
	s.use("Ack", m, true)
	s.acks.Add(1)
	return nil
}
func (s *reuseSource) Nack(_ context.Context, m *ackwise.Message, d time.Duration) error {
	s.use("Nack", m, true)
	s.nacks.Add(1)
	return nil
}
func (s *reuseSource) DeadLetter(_ context.Context, m *ackwise.Message, env dlq.Envelope) error {
	s.use("DeadLetter", m, true)
	s.dead.Add(1)
	return nil
}
func (s *reuseSource) Release(_ context.Context, m *ackwise.Message) error {
	s.use("Release", m, true)
	s.rel.Add(1)
	return nil
}
func (s *reuseSource) ExtendLease(_ context.Context, m *ackwise.Message, _ time.Duration) error {
	s.use("ExtendLease", m, false)
	return nil
}
func (s *reuseSource) Valid(m *ackwise.Message) bool {
	s.use("Valid", m, false)
	return true
}
func (s *reuseSource) Capabilities() adapters.Capabilities { return s.caps }
func (s *reuseSource) Extensions() adapters.Extensions {
	return adapters.Extensions{Recycler: s}
}
func (s *reuseSource) Close() error { return nil }
func (s *reuseSource) Recycle(msgs ...*ackwise.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		if !s.live[m] {
			s.t.Errorf("recycle of a recycled message %q", m.ID)
			continue
		}
		if !s.settled[m] {
			s.t.Errorf("recycle of an unsettled message %q", m.ID)
		}
		delete(s.live, m)
		m.ID = "RECYCLED"
		s.free = append(s.free, m)
	}
}

type obs struct{ s *reuseSource }

func (o obs) Observe(m *ackwise.Message, _ consumer.Outcome, _ time.Duration) {
	o.s.use("Observe", m, false)
}

// batchReuseSource is a reuseSource that acks in batches
// (adapters.BatchAcker): the engine takes another path to ack.
type batchReuseSource struct{ *reuseSource }

func (s batchReuseSource) AckBatch(ctx context.Context, msgs []*ackwise.Message, errs []error) {
	for i, m := range msgs {
		errs[i] = s.Ack(ctx, m)
	}
}

var _ adapters.BatchAcker = batchReuseSource{}

func (s batchReuseSource) Extensions() adapters.Extensions {
	return adapters.Extensions{Recycler: s.reuseSource, BatchAcker: s}
}

func TestRecycleStressSettleOnce(t *testing.T) {
	for _, pace := range paces {
		for _, mode := range []consumer.RetryMode{consumer.RetryInPlace, consumer.RetryBroker} {
			for _, batchAck := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%v/batchAck=%t", pace, mode, batchAck), func(t *testing.T) {
					const n = 3000
					src := newReuseSource(t, adapters.Capabilities{Delay: true, Lease: 30 * time.Millisecond, ExtendLease: true}, n)
					var source adapters.Source = src
					if batchAck {
						source = batchReuseSource{src}
					}
					h := stressHandler(true)
					c := newPaced(t, source, h, consumer.Config{Concurrency: 3, MaxInFlight: 40, ReceiveBatch: 16, RetryMode: mode, Observer: obs{src}, Retry: retry.Policy{MaxAttempts: 3, InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond}}, pace)
					stop := run(t, c)
					deadline := time.Now().Add(20 * time.Second)
					for {
						done := src.acks.Load() + src.nacks.Load() + src.dead.Load()
						if mode == consumer.RetryInPlace && done >= n {
							break
						}
						if mode == consumer.RetryBroker && done >= n {
							break
						}
						if time.Now().After(deadline) {
							t.Fatalf("stuck: %+v", c.Stats())
						}
						time.Sleep(time.Millisecond)
					}
					if err := stop(); err != nil {
						t.Fatal(err)
					}
				})
			}
		}
	}
}

func TestRecycleStressBreakerDrain(t *testing.T) {
	for _, pace := range paces {
		for _, stuck := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stuck-%v", pace, stuck), func(t *testing.T) {
				const n = 2000
				src := newReuseSource(t, adapters.Capabilities{Delay: true}, n)
				var calls atomic.Int64
				var down atomic.Bool
				block := make(chan struct{})
				started := make(chan struct{})
				h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
					c := calls.Add(1)
					if c == 300 {
						down.Store(true)
						time.AfterFunc(30*time.Millisecond, func() { down.Store(false) })
					}
					if stuck && c == 1000 {
						close(started)
						<-block
					}
					if down.Load() {
						return errors.New("down")
					}
					return nil
				})
				c := newPaced(t, src, h, consumer.Config{Concurrency: 3, MaxInFlight: 40, ReceiveBatch: 16, RetryMode: consumer.RetryInPlace, Observer: obs{src}, DrainTimeout: 20 * time.Millisecond,
					Breaker: &consumer.Breaker{Threshold: 3, ProbeInterval: 5 * time.Millisecond, MaxProbeInterval: 10 * time.Millisecond},
					Retry:   retry.Policy{MaxAttempts: -1, InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond}}, pace)
				stop := run(t, c)
				deadline := time.Now().Add(20 * time.Second)
				for src.acks.Load() < 1100 {
					if stuck {
						select {
						case <-started:
							time.Sleep(5 * time.Millisecond) // pacing: the load runs on beside the stuck handler a while; nothing waits on where it got
							goto out
						default:
						}
					}
					if time.Now().After(deadline) {
						t.Fatalf("stuck: %+v", c.Stats())
					}
					time.Sleep(time.Millisecond)
				}
			out:
				err := stop()
				if stuck {
					close(block)
					if !errors.Is(err, consumer.ErrDrainTimeout) && err != nil {
						t.Fatal(err)
					}
				} else if err != nil {
					t.Fatal(err)
				}
				if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.InFlight == 0 }) {
					t.Fatalf("in flight after drain: %+v", c.Stats())
				}
				// A finisher recycles its message after it leaves the
				// in-flight count; there is no signal for it: poll.
				for deadline := time.Now().Add(5 * time.Second); ; {
					src.mu.Lock()
					left := len(src.live)
					src.mu.Unlock()
					if left == 0 || time.Now().After(deadline) {
						break
					}
					time.Sleep(time.Millisecond)
				}
				src.mu.Lock()
				live := 0
				for m := range src.live {
					if !src.settled[m] {
						t.Errorf("%s never settled", m.ID)
					}
					live++
				}
				src.mu.Unlock()
				if live != 0 {
					t.Errorf("%d messages never recycled", live)
				}
			})
		}
	}
}

// flakySettle is a reuseSource whose every seventh settle call (Ack, Nack
// or DeadLetter) fails: the engine releases that message and, when it is
// ordered, the messages queued behind it in its lane.
type flakySettle struct {
	*reuseSource
	calls atomic.Int64
}

func (s *flakySettle) fails(op string, m *ackwise.Message) error {
	if s.calls.Add(1)%7 != 0 {
		return nil
	}
	s.use(op, m, false)
	return errors.New(op + ": connection reset by peer")
}

func (s *flakySettle) Ack(ctx context.Context, m *ackwise.Message) error {
	if err := s.fails("Ack", m); err != nil {
		return err
	}
	return s.reuseSource.Ack(ctx, m)
}

func (s *flakySettle) Nack(ctx context.Context, m *ackwise.Message, d time.Duration) error {
	if err := s.fails("Nack", m); err != nil {
		return err
	}
	return s.reuseSource.Nack(ctx, m, d)
}

func (s *flakySettle) DeadLetter(ctx context.Context, m *ackwise.Message, env dlq.Envelope) error {
	if err := s.fails("DeadLetter", m); err != nil {
		return err
	}
	return s.reuseSource.DeadLetter(ctx, m, env)
}

type flakyBatch struct{ *flakySettle }

func (s flakyBatch) Extensions() adapters.Extensions {
	return adapters.Extensions{Recycler: s.reuseSource, BatchAcker: s}
}

func (s flakyBatch) AckBatch(ctx context.Context, msgs []*ackwise.Message, errs []error) {
	for i, m := range msgs {
		errs[i] = s.Ack(ctx, m)
	}
}

// Ordered messages whose settles fail now and then, so that their lanes are
// released behind them, with heartbeats, the breaker, in-place or broker
// retries, in every pace, run to the end or stopped midway: every message
// received is settled or released once, recycled once after the engine is
// done with it, and nothing stays in flight.
func TestRecycleStressFailedSettleOrdered(t *testing.T) {
	for _, pace := range paces {
		for _, mode := range []consumer.RetryMode{consumer.RetryInPlace, consumer.RetryBroker} {
			for _, ord := range []consumer.Ordering{consumer.OrderKey, consumer.OrderPartition} {
				for _, batchAck := range []bool{false, true} {
					for _, early := range []bool{false, true} {
						t.Run(fmt.Sprintf("%s/%v/%v/batchAck=%t/early=%t", pace, mode, ord, batchAck, early), func(t *testing.T) {
							failedSettleStress(t, pace, mode, ord, batchAck, early)
						})
					}
				}
			}
		}
	}
}

func failedSettleStress(t *testing.T, pace string, mode consumer.RetryMode, ord consumer.Ordering, batchAck, early bool) {
	n := 1500
	if testing.Short() {
		n = 500 // every combination still, fewer messages each
	}
	stopAt := int64(n)
	if early {
		stopAt = int64(n / 3)
	}
	rs := newReuseSource(t, adapters.Capabilities{Delay: true, Lease: 3 * time.Millisecond, ExtendLease: true}, n)
	fs := &flakySettle{reuseSource: rs}
	var source adapters.Source = fs
	if batchAck {
		source = flakyBatch{fs}
	}
	h := stressHandler(false)
	c := newPaced(t, source, h, consumer.Config{Ordering: ord, Concurrency: 3, MaxInFlight: 40, ReceiveBatch: 16, RetryMode: mode, Observer: obs{rs},
		Breaker: &consumer.Breaker{Threshold: 5, ProbeInterval: time.Millisecond, MaxProbeInterval: 2 * time.Millisecond},
		Retry:   retry.Policy{MaxAttempts: 3, InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond}}, pace)
	stop := run(t, c)
	deadline := time.Now().Add(time.Minute) // a hang detector: generous on a busy machine
	for rs.acks.Load()+rs.nacks.Load()+rs.dead.Load()+rs.rel.Load() < stopAt {
		if time.Now().After(deadline) {
			t.Fatalf("stuck: %+v", c.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.InFlight != 0 {
		t.Fatalf("in flight after the drain: %+v", st)
	}
	// A finisher recycles its message after it leaves the in-flight count
	// (the heartbeat after its round); there is no signal for it: poll.
	for deadline := time.Now().Add(5 * time.Second); ; {
		rs.mu.Lock()
		left := len(rs.live)
		rs.mu.Unlock()
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages never recycled", left)
		}
		time.Sleep(time.Millisecond)
	}
}
