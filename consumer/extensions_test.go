package consumer_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// declaring is a memory log member that declares all four extensions and
// counts the engine's calls of each.
type declaring struct {
	*memory.GroupSource
	recycled, batches, detached, onInvalid, told atomic.Int64
}

func (s *declaring) Extensions() adapters.Extensions {
	return adapters.Extensions{Recycler: s, BatchAcker: s, Detacher: s, Invalidator: s}
}

func (s *declaring) Recycle(msgs ...*ackwise.Message) { s.recycled.Add(int64(len(msgs))) }

func (s *declaring) AckBatch(ctx context.Context, msgs []*ackwise.Message, errs []error) {
	s.batches.Add(1)
	for i, m := range msgs {
		errs[i] = s.Ack(ctx, m)
	}
}

func (s *declaring) Detach(*ackwise.Message) { s.detached.Add(1) }

func (s *declaring) OnInvalid(f func()) {
	s.onInvalid.Add(1)
	if f == nil {
		s.GroupSource.OnInvalid(nil)
		return
	}
	s.GroupSource.OnInvalid(func() {
		s.told.Add(1)
		f()
	})
}

// receiveCounter wraps a source as a user's logging or metrics wrapper
// does: it embeds the Source interface and changes Receive only. Before
// sources declared their extensions, such a wrapper hid them all.
type receiveCounter struct {
	adapters.Source
	received atomic.Int64
}

func (w *receiveCounter) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	n, err := w.Source.Receive(ctx, buf)
	w.received.Add(int64(n))
	return n, err
}

// TestWrapperKeepsExtensions: a source wrapped in another that embeds it
// keeps its extensions. The engine acks through AckBatch, recycles what it
// is done with, detaches the message that starts a retry in place, and sets
// OnInvalid, all through the wrapper; and when the log partition is reset
// under the waiting retry, the source's call reaches the engine, which
// hands the message back at once, on a clock that never moves.
func TestWrapperKeepsExtensions(t *testing.T) {
	t.Parallel()
	b, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	topic := memorytest.UniqueName(t)
	if err := b.CreateTopic(topic, memory.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	memorytest.Publish(t, b, topic, memorytest.Msg("a", "ka", "1"), memorytest.Msg("b", "kb", "2"), memorytest.Msg("retry", "kr", "3"))
	member, err := b.JoinGroup(topic, "g")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { member.Close() })
	src := &declaring{GroupSource: member}
	wrapped := &receiveCounter{Source: src}
	var failed atomic.Bool
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == "retry" && failed.CompareAndSwap(false, true) {
			return ackwise.RetryAfter(errors.New("429"), time.Hour)
		}
		return nil
	})
	clock := memory.NewVirtualClock(time.Time{})
	c, err := consumer.New(wrapped, h, consumer.Config{RetryMode: consumer.RetryInPlace, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clock.WaitForTimers(ctx, 1); err != nil {
		t.Fatalf("the retry does not wait in place: %v", err)
	}
	if !waitStats(c, 10*time.Second, func(s consumer.Stats) bool { return s.Acked == 2 }) {
		t.Fatalf("stats %+v: want a and b acked", c.Stats())
	}
	// The reset invalidates the waiting delivery: the engine hands it back
	// now, not in an hour, and the redelivery is acked.
	if err := b.SeekGroup(topic, "g", 0, 2); err != nil {
		t.Fatal(err)
	}
	if !waitStats(c, 10*time.Second, func(s consumer.Stats) bool { return s.Acked == 3 && s.InFlight == 0 }) {
		t.Fatalf("stats %+v: want the waiting retry handed back when its delivery was invalidated, and its redelivery acked", c.Stats())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	received := c.Stats().Received
	switch {
	case wrapped.received.Load() != int64(received):
		t.Errorf("the wrapper's Receive passed on %d messages, the engine received %d", wrapped.received.Load(), received)
	case src.onInvalid.Load() == 0:
		t.Error("the engine never set OnInvalid through the wrapper")
	case src.told.Load() == 0:
		t.Error("the source's invalidation never reached the engine through the wrapper")
	case src.batches.Load() == 0:
		t.Error("the engine never acked through AckBatch behind the wrapper")
	case src.detached.Load() == 0:
		t.Error("the engine did not Detach the message that waits in place behind the wrapper")
	case src.recycled.Load() != int64(received):
		t.Errorf("the engine recycled %d messages behind the wrapper, want the %d it received", src.recycled.Load(), received)
	}
}

// attemptsSource declares an AttemptsChecker that records what the engine
// asked and answers err.
type attemptsSource struct {
	*fakeSource
	got []int
	err error
}

func (s *attemptsSource) Extensions() adapters.Extensions {
	return adapters.Extensions{AttemptsChecker: s}
}

func (s *attemptsSource) CheckAttempts(n int) error {
	s.got = append(s.got, n)
	return s.err
}

// consumer.New hands a source's AttemptsChecker the retry policy's max
// attempts with the defaults applied (5, unlimited as -1), once, and fails
// with its error, wrapped.
func TestNewChecksAttemptsWithTheSource(t *testing.T) {
	t.Parallel()
	errDisagree := errors.New("maxReceiveCount 3")
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })
	for _, tc := range []struct {
		policy retry.Policy
		err    error
		want   int
	}{
		{retry.Policy{}, nil, retry.DefaultMaxAttempts},
		{retry.Policy{MaxAttempts: retry.Unlimited}, nil, retry.Unlimited},
		{retry.Policy{MaxAttempts: 7}, errDisagree, 7},
	} {
		src := &attemptsSource{fakeSource: newFakeSource(adapters.Capabilities{}), err: tc.err}
		_, err := consumer.New(src, h, consumer.Config{Retry: tc.policy})
		if !slices.Equal(src.got, []int{tc.want}) {
			t.Errorf("policy %+v: CheckAttempts called with %v, want [%d]", tc.policy, src.got, tc.want)
		}
		if !errors.Is(err, tc.err) || (tc.err != nil && !strings.Contains(err.Error(), "Retry.MaxAttempts = 7")) {
			t.Errorf("policy %+v: New error %v, want %v wrapped, naming the consumer's max attempts", tc.policy, err, tc.err)
		}
	}
}
