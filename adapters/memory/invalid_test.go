package memory_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
)

// keyOn returns a key that goes to partition p of a topic of n partitions.
func keyOn(t *testing.T, p int32, n int) string {
	t.Helper()
	for i := 0; ; i++ {
		if k := fmt.Sprintf("k%d", i); memory.PartitionOf(k, n) == p {
			return k
		}
	}
}

// invalidProbe is an OnInvalid hook that checks, each time it is called,
// that the message it watches is no longer Valid and that the broker's
// lock is not held (the call in locked, which takes it, returns).
type invalidProbe struct {
	t      *testing.T
	src    adapters.Source
	msg    *ackwise.Message
	locked func()
	calls  atomic.Int32
}

func (p *invalidProbe) hook() {
	p.calls.Add(1)
	if p.msg != nil && p.src.Valid(p.msg) {
		p.t.Errorf("hook called while %s is still Valid", p.msg.ID)
	}
	done := make(chan struct{})
	go func() {
		p.locked()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		p.t.Errorf("hook called with the broker's lock held")
	}
}

// requireTold sets src's hook, runs event and checks that the hook was
// called (told) or not, as told says, and that m's Valid agrees.
func requireTold(t *testing.T, src invalidator, m *ackwise.Message, locked func(), told bool, event func()) {
	t.Helper()
	p := &invalidProbe{t: t, src: src, locked: locked}
	if told {
		p.msg = m
	}
	src.OnInvalid(p.hook)
	event()
	if c := p.calls.Load(); (c > 0) != told {
		t.Fatalf("hook called %d times, want told = %v", c, told)
	}
	if src.Valid(m) == told {
		t.Fatalf("Valid = %v after the event", !told)
	}
}

type invalidator interface {
	adapters.Source
	adapters.Invalidator
}

// Every event that makes a log member's deliveries stop being Valid tells
// it (adapters.Invalidator), without the broker's lock held, after Valid
// turned false; a rebalance that leaves the member its partitions does not.
func TestGroupSourceOnInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		parts int
		event func(t *testing.T, tb *testBundle, a *memory.GroupSource, topic string)
		told  bool
	}{
		{"a member joins and takes the partition", 2, func(t *testing.T, tb *testBundle, _ *memory.GroupSource, topic string) {
			tb.member(t, topic, "g")
		}, true},
		{"seek resets the partition", 2, func(t *testing.T, tb *testBundle, _ *memory.GroupSource, topic string) {
			if err := tb.b.SeekGroup(topic, "g", 1, memory.OffsetEarliest); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"close", 2, func(_ *testing.T, _ *testBundle, a *memory.GroupSource, _ string) { a.Close() }, true},
		{"crash", 2, func(_ *testing.T, _ *testBundle, a *memory.GroupSource, _ string) { a.Crash() }, true},
		{"injected crash on ack", 2, func(t *testing.T, tb *testBundle, a *memory.GroupSource, topic string) {
			if _, err := a.InjectFault(memory.Fault{Kind: memory.FaultCrashBeforeAck}); err != nil {
				t.Fatal(err)
			}
			tb.publish(t, topic, msg("other", keyOn(t, 0, 2)))
			if err := a.Ack(tb.ctx, recvOne(t, a)); !errors.Is(err, memory.ErrCrashed) {
				t.Fatalf("Ack = %v, want ErrCrashed", err)
			}
		}, true},
		{"topic deleted", 2, func(_ *testing.T, tb *testBundle, _ *memory.GroupSource, topic string) { tb.b.Delete(topic) }, true},
		{"a member joins and takes no partition", 1, func(t *testing.T, tb *testBundle, _ *memory.GroupSource, topic string) {
			tb.member(t, topic, "g")
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb := setup(t)
			topic := "events"
			if err := tb.b.CreateTopic(topic, memory.TopicConfig{Partitions: tc.parts}); err != nil {
				t.Fatal(err)
			}
			a := tb.member(t, topic, "g")
			tb.publish(t, topic, msg("m", keyOn(t, int32(tc.parts-1), tc.parts)))
			m := recvOne(t, a)
			requireTold(t, a, m, func() { a.Assigned() }, tc.told, func() { tc.event(t, tb, a, topic) })
		})
	}
}

// A queue source tells of the events that end its deliveries: its close
// or crash, and a duplicate delivery settled through its twin. Settling a
// delivery that has no twin, an event of the engine's own, does not.
func TestQueueSourceOnInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		dup  bool
		// event ends the delivery watched, the second one with dup.
		event func(t *testing.T, tb *testBundle, src *memory.QueueSource, got []*ackwise.Message)
		told  bool
	}{
		{"close", false, func(_ *testing.T, _ *testBundle, s *memory.QueueSource, _ []*ackwise.Message) { s.Close() }, true},
		{"crash", false, func(_ *testing.T, _ *testBundle, s *memory.QueueSource, _ []*ackwise.Message) { s.Crash() }, true},
		{"injected crash on ack", false, func(t *testing.T, tb *testBundle, s *memory.QueueSource, _ []*ackwise.Message) {
			if _, err := s.InjectFault(memory.Fault{Kind: memory.FaultCrashBeforeAck}); err != nil {
				t.Fatal(err)
			}
			tb.publish(t, "q", msg("other", ""))
			if err := s.Ack(tb.ctx, recvOne(t, s)); !errors.Is(err, memory.ErrCrashed) {
				t.Fatalf("Ack = %v, want ErrCrashed", err)
			}
		}, true},
		{"queue deleted", false, func(_ *testing.T, tb *testBundle, _ *memory.QueueSource, _ []*ackwise.Message) { tb.b.Delete("q") }, true},
		{"twin acked", true, func(t *testing.T, tb *testBundle, s *memory.QueueSource, got []*ackwise.Message) {
			if err := s.Ack(tb.ctx, got[0]); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"twin released", true, func(t *testing.T, tb *testBundle, s *memory.QueueSource, got []*ackwise.Message) {
			if err := s.Release(tb.ctx, got[0]); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"twin nacked", true, func(t *testing.T, tb *testBundle, s *memory.QueueSource, got []*ackwise.Message) {
			if err := s.Nack(tb.ctx, got[0], time.Hour); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"another message acked", false, func(t *testing.T, tb *testBundle, s *memory.QueueSource, _ []*ackwise.Message) {
			tb.publish(t, "q", msg("other", ""))
			if err := s.Ack(tb.ctx, recvOne(t, s)); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb := setup(t)
			s := tb.queue(t, "q", memory.QueueConfig{Lease: time.Minute})
			if tc.dup {
				if _, err := s.InjectFault(memory.Fault{Kind: memory.FaultDuplicate, Count: 1}); err != nil {
					t.Fatal(err)
				}
			}
			tb.publish(t, "q", msg("m", ""))
			n := 1
			if tc.dup {
				n = 2
			}
			got := recv(t, s, n)
			requireTold(t, s, got[n-1], func() { tb.b.Stats("q") }, tc.told, func() { tc.event(t, tb, s, got) })
		})
	}
}

// A log record whose retry waits in place for an hour on a clock that never
// moves is handed back as soon as its partition changes hands (a member
// joins) or is reset (SeekGroup), not when its wait ends; the record of its
// key queued behind it goes back unrun, observed as Released. The new owner
// reads the partition's records from the committed offset again.
func TestRebalanceEndsWaitInPlace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		event func(t *testing.T, tb *testBundle, topic string) adapters.Source
	}{
		{"member joins", func(t *testing.T, tb *testBundle, topic string) adapters.Source {
			return tb.member(t, topic, "g")
		}},
		{"seek past the records", func(t *testing.T, tb *testBundle, topic string) adapters.Source {
			if err := tb.b.SeekGroup(topic, "g", 1, memory.OffsetLatest); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb := setup(t)
			topic := "events"
			if err := tb.b.CreateTopic(topic, memory.TopicConfig{Partitions: 2}); err != nil {
				t.Fatal(err)
			}
			a := tb.member(t, topic, "g") // owns both partitions
			key := keyOn(t, 1, 2)
			tb.publish(t, topic, msg("first", key), msg("second", key))

			var runs atomic.Int32
			h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
				runs.Add(1)
				return ackwise.RetryAfter(errors.New("429"), time.Hour)
			})
			released := make(chan string, 2)
			obs := observerFunc(func(m *ackwise.Message, o consumer.Outcome, _ time.Duration) {
				if o == consumer.Released {
					released <- m.ID
				}
			})
			c, err := consumer.New(a, h, consumer.Config{Ordering: consumer.OrderKey, Clock: tb.clk, Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			runConsumer(t, c)

			wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer wcancel()
			if err := tb.clk.WaitForTimers(wctx, 1); err != nil {
				t.Fatalf("the first record does not wait: %v", err)
			}
			owner := tc.event(t, tb, topic)
			select {
			case id := <-released:
				if id != "second" {
					t.Fatalf("released %s, want the record queued behind the waiting one", id)
				}
			case <-wctx.Done():
				t.Fatalf("stats %+v: the waiting record was not handed back when its partition changed hands", c.Stats())
			}
			if st := c.Stats(); st.Retried != 1 || st.Acked+st.DeadLettered != 0 || runs.Load() != 1 {
				t.Fatalf("stats %+v, %d handler runs: want the first record run once, the second not at all", st, runs.Load())
			}
			if owner != nil {
				if got := ids(recv(t, owner, 2)); got[0] != "first" || got[1] != "second" {
					t.Fatalf("the new owner received %v, want [first second]", got)
				}
			}
		})
	}
}

type observerFunc func(*ackwise.Message, consumer.Outcome, time.Duration)

func (f observerFunc) Observe(m *ackwise.Message, o consumer.Outcome, d time.Duration) { f(m, o, d) }

// Records an open breaker holds on a log member, probing once an hour on a
// clock that never moves, are handed back as soon as their partition
// changes hands (a member joins), observed as Released, and the breaker,
// left holding nothing, closes: the member goes on with the partition it
// kept.
func TestRebalanceEndsBreakerHold(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	topic := "events"
	if err := tb.b.CreateTopic(topic, memory.TopicConfig{Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	a := tb.member(t, topic, "g") // owns both partitions; partition 1 goes to the next member
	k0, k1 := keyOn(t, 0, 2), keyOn(t, 1, 2)
	tb.publish(t, topic, msg("held", k1), msg("behind", k1))

	var down atomic.Bool
	down.Store(true)
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == "held" && down.Load() {
			return errors.New("503: dependency down")
		}
		return nil
	})
	c, err := consumer.New(a, h, consumer.Config{
		Ordering: consumer.OrderKey, Clock: tb.clk,
		Breaker: &consumer.Breaker{Threshold: 1, ProbeInterval: time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	runConsumer(t, c)
	waitFor := func(what string, ok func(consumer.Stats) bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(c.Stats()); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("stats %+v: %s", c.Stats(), what)
			}
		}
	}
	waitFor("want the first record held by the open breaker", func(s consumer.Stats) bool { return s.Held == 1 && s.Paused })
	b := tb.member(t, topic, "g")
	waitFor("want both records of the revoked partition released and the breaker closed", func(s consumer.Stats) bool {
		return s.Released == 2 && s.InFlight == 0 && !s.Paused && s.Held == 0
	})
	if got := ids(recv(t, b, 2)); got[0] != "held" || got[1] != "behind" {
		t.Fatalf("the new owner received %v, want [held behind]", got)
	}
	tb.publish(t, topic, msg("after", k0))
	waitFor("want the record published after the breaker closed acked", func(s consumer.Stats) bool { return s.Acked == 1 })
}

// runConsumer runs c until the test ends, then checks that Run returned
// nil.
func runConsumer(t *testing.T, c *consumer.Consumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}
