package adaptertest

import (
	"context"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

func testPerKeyOrder(t *testing.T, h Harness) {
	const n, keys = 300, 10
	f := h.Open(t, FixtureConfig{Partitions: 3})
	in := batch(n, keys)
	h.publish(t, f, in)
	var mu sync.Mutex
	active := map[string]bool{}
	var overlap atomic.Int64
	rec := h.newRecorder(func(_ context.Context, m *ackwise.Message) error {
		mu.Lock()
		if active[m.Key] {
			overlap.Add(1)
		}
		active[m.Key] = true
		mu.Unlock()
		time.Sleep(time.Millisecond) // hold the key long enough for overlap to show
		mu.Lock()
		active[m.Key] = false
		mu.Unlock()
		return nil
	})
	src := f.NewSource(t)
	h.start(t, src, rec, consumer.Config{Concurrency: 8, MaxInFlight: 64})
	rec.waitFor(t, "all handled", func() bool { return len(rec.byID) == n })
	if o := overlap.Load(); o != 0 {
		t.Fatalf("a key was handled concurrently %d times", o)
	}
	if !src.Capabilities().Ordered {
		t.Log("source does not promise broker order per key: checked one-at-a-time per key only")
		return
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	last := map[string]int{}
	for _, m := range rec.seen {
		i, _ := strconv.Atoi(string(m.Payload))
		if prev, ok := last[m.Key]; ok && i < prev {
			t.Fatalf("key %s: message %d handled after %d", m.Key, i, prev)
		}
		last[m.Key] = i
	}
}

func testRestart(t *testing.T, h Harness) {
	const n = 200
	f := h.Open(t, FixtureConfig{Lease: time.Second, Partitions: 2})
	in := batch(n, 20)
	h.publish(t, f, in)
	var handled atomic.Int64
	first := h.newRecorder(func(context.Context, *ackwise.Message) error {
		handled.Add(1)
		return nil
	})
	src1 := f.NewSource(t)
	_, stop := h.start(t, src1, first, consumer.Config{Concurrency: 4, MaxInFlight: 8})
	first.waitFor(t, "a first share", func() bool { return len(first.byID) >= n/4 })
	if err := stop(); err != nil {
		t.Fatalf("first consumer: %v", err)
	}
	if err := src1.Close(); err != nil {
		t.Fatalf("close first source: %v", err)
	}
	second := h.newRecorder(nil)
	h.start(t, f.NewSource(t), second, consumer.Config{Concurrency: 4})
	second.waitFor(t, "the rest", func() bool {
		first.mu.Lock()
		defer first.mu.Unlock()
		for _, m := range in {
			if first.byID[m.ID] == 0 && second.byID[m.ID] == 0 {
				return false
			}
		}
		return true
	})
}

func testDrain(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{Lease: time.Second})
	in := batch(5, 1) // one key: one at a time
	h.publish(t, f, in)
	started := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	rec := h.newRecorder(func(_ context.Context, m *ackwise.Message) error {
		once.Do(func() {
			close(started)
			<-release
		})
		return nil
	})
	src := f.NewSource(t)
	_, stop := h.start(t, src, rec, consumer.Config{DrainTimeout: h.Timeout})
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// Run must wait for the running handler: give it a moment to return
	// early if it were going to.
	select {
	case err := <-stopped:
		t.Fatalf("Run returned (%v) while a handler was running", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("drain: %v", err)
	}
	if err := src.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	rec.mu.Lock()
	finished := map[string]bool{}
	for _, m := range rec.seen {
		finished[m.ID] = true
	}
	rec.mu.Unlock()
	if len(finished) == 0 || len(finished) == len(in) {
		t.Fatalf("%d of %d handled before the drain ended, want the running one and not all", len(finished), len(in))
	}
	// What finished during the drain was acknowledged; the rest comes back.
	next := h.newRecorder(nil)
	h.start(t, f.NewSource(t), next, consumer.Config{})
	next.waitFor(t, "the rest after the drain", func() bool {
		for _, m := range in {
			if !finished[m.ID] && next.byID[m.ID] == 0 {
				return false
			}
		}
		return true
	})
	next.mu.Lock()
	defer next.mu.Unlock()
	for id := range finished {
		if next.byID[id] != 0 {
			t.Fatalf("message %s finished during the drain but was delivered again", id)
		}
	}
}

// countingSource counts deliveries handed out and not yet settled.
type countingSource struct {
	adapters.Source
	out, max atomic.Int64
}

func (s *countingSource) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	n, err := s.Source.Receive(ctx, buf)
	v := s.out.Add(int64(n))
	for {
		m := s.max.Load()
		if v <= m || s.max.CompareAndSwap(m, v) {
			break
		}
	}
	return n, err
}

func (s *countingSource) done() { s.out.Add(-1) }
func (s *countingSource) Ack(ctx context.Context, m *ackwise.Message) error {
	s.done()
	return s.Source.Ack(ctx, m)
}
func (s *countingSource) Nack(ctx context.Context, m *ackwise.Message, d time.Duration) error {
	s.done()
	return s.Source.Nack(ctx, m, d)
}
func (s *countingSource) DeadLetter(ctx context.Context, m *ackwise.Message, e dlq.Envelope) error {
	s.done()
	return s.Source.DeadLetter(ctx, m, e)
}
func (s *countingSource) Release(ctx context.Context, m *ackwise.Message) error {
	s.done()
	return s.Source.Release(ctx, m)
}

// Extensions drops BatchAcker, whose AckBatch would ack around
// countingSource.Ack, uncounted.
func (s *countingSource) Extensions() adapters.Extensions {
	ext := s.Source.Extensions()
	ext.BatchAcker = nil
	return ext
}

func testInFlightBounded(t *testing.T, h Harness) {
	const n, limit = 100, 6
	f := h.Open(t, FixtureConfig{})
	in := batch(n, n)
	h.publish(t, f, in)
	src := &countingSource{Source: f.NewSource(t)}
	var running, peak atomic.Int64
	rec := h.newRecorder(func(context.Context, *ackwise.Message) error {
		v := running.Add(1)
		for {
			p := peak.Load()
			if v <= p || peak.CompareAndSwap(p, v) {
				break
			}
		}
		time.Sleep(time.Millisecond)
		running.Add(-1)
		return nil
	})
	h.start(t, src, rec, consumer.Config{Concurrency: 3, MaxInFlight: limit})
	rec.waitFor(t, "all handled", func() bool { return len(rec.byID) == n })
	if got := src.max.Load(); got > limit {
		t.Fatalf("%d messages in flight at once, limit %d", got, limit)
	}
	if got := peak.Load(); got > 3 {
		t.Fatalf("%d handlers at once, Concurrency 3", got)
	}
	ids := make([]string, 0, n)
	rec.mu.Lock()
	for id := range rec.byID {
		ids = append(ids, id)
	}
	rec.mu.Unlock()
	sort.Strings(ids)
	if len(ids) != n {
		t.Fatalf("handled %d distinct, want %d", len(ids), n)
	}
}
