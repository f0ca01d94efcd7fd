package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
)

// Tests of the hand-off from the receive loop to the handlers, for each
// pace (see handoff.go): single (slow handlers), batch and inline (fast
// ones), pinned, and adaptive.

var paces = []string{"single", "batch", "inline", "adaptive"}

func newPaced(t *testing.T, src adapters.Source, h ackwise.Handler, cfg consumer.Config, pace string) *consumer.Consumer {
	t.Helper()
	c, err := consumer.New(src, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if pace != "adaptive" {
		consumer.PinPace(c, pace)
	}
	return c
}

// orderChecker fails t when two messages of a key run at once or out of
// arrival order, or when more than limit handlers run at once.
type orderChecker struct {
	t       *testing.T
	limit   int64
	mu      sync.Mutex
	running map[string]bool
	last    map[string]int
	now     atomic.Int64
	max     atomic.Int64
}

func newOrderChecker(t *testing.T, limit int) *orderChecker {
	return &orderChecker{t: t, limit: int64(limit), running: map[string]bool{}, last: map[string]int{}}
}

func (o *orderChecker) enter(m *ackwise.Message) {
	if n := o.now.Add(1); n > o.max.Load() {
		o.max.Store(n) // racy maximum: good enough, n itself is exact
		if n > o.limit {
			o.t.Errorf("%d handlers running at once, Concurrency %d", n, o.limit)
		}
	}
	if m.Key == "" {
		return
	}
	i, _ := strconv.Atoi(string(m.Payload))
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.running[m.Key] {
		o.t.Errorf("key %s handled concurrently", m.Key)
	}
	o.running[m.Key] = true
	if prev, ok := o.last[m.Key]; ok && prev > i {
		o.t.Errorf("key %s: %d after %d", m.Key, i, prev)
	}
	o.last[m.Key] = i
}

func (o *orderChecker) leave(m *ackwise.Message) {
	o.now.Add(-1)
	if m.Key == "" {
		return
	}
	o.mu.Lock()
	o.running[m.Key] = false
	o.mu.Unlock()
}

// TestHandOffKeepsOrderAndLimits runs many messages through each pace, with
// many keys (lanes mostly idle), very many (idle lanes dropped) and few (long
// lane queues, so lane successors travel in chunks), some without a key: per-key order, one
// message per key at a time, at most Concurrency handlers and MaxInFlight
// messages in flight.
func TestHandOffKeepsOrderAndLimits(t *testing.T) {
	t.Parallel()
	n := 20000
	if raceEnabled {
		n = 4000
	}
	for _, pace := range paces {
		// 5000 keys: more than the lanes kept (4 × MaxInFlight, at least
		// 1024), so idle lanes are dropped and made again.
		for _, keys := range []int{7, 500, 5000} {
			t.Run(fmt.Sprintf("%s/keys-%d", pace, keys), func(t *testing.T) {
				t.Parallel()
				all := msgs(n, keys)
				for i := 0; i < len(all); i += 10 {
					all[i].Key = "" // unordered
				}
				src := newFakeSource(adapters.Capabilities{Delay: true}, all...)
				const conc, limit = 4, 48
				chk := newOrderChecker(t, conc)
				h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
					chk.enter(m)
					chk.leave(m)
					return nil
				})
				c := newPaced(t, src, h, consumer.Config{Concurrency: conc, MaxInFlight: limit, ReceiveBatch: 16}, pace)
				stop := run(t, c)
				if !src.waitSettled(n, 20*time.Second) {
					t.Fatalf("not all settled: %+v", c.Stats())
				}
				if err := stop(); err != nil {
					t.Fatal(err)
				}
				src.mu.Lock()
				defer src.mu.Unlock()
				if src.maxOut > limit {
					t.Fatalf("in flight reached %d, limit %d", src.maxOut, limit)
				}
				if st := c.Stats(); st.Acked != uint64(n) || st.InFlight != 0 {
					t.Fatalf("stats %+v", st)
				}
			})
		}
	}
}

// TestHandOffSlowMessageInFastChunk: one message of a fast chunk blocks. The
// messages that ran before it are acked and finished (their lanes and
// in-flight slots freed) except at most 7 of them, the documented bound.
func TestHandOffSlowMessageInFastChunk(t *testing.T) {
	t.Parallel()
	for _, pace := range []string{"batch", "inline"} {
		t.Run(pace, func(t *testing.T) {
			t.Parallel()
			const n, slow = 32, 10
			src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(n, n)...)
			started, release := make(chan struct{}), make(chan struct{})
			h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
				if m.ID == "e"+strconv.Itoa(slow) {
					close(started)
					<-release
				}
				return nil
			})
			// One worker and one receive of all n: one chunk of n.
			c := newPaced(t, src, h, consumer.Config{Concurrency: 1, MaxInFlight: n, ReceiveBatch: n}, pace)
			run(t, c)
			<-started
			src.mu.Lock()
			acked := len(src.acked)
			src.mu.Unlock()
			const bound = 7
			if waiting := slow - acked; waiting > bound {
				t.Errorf("%d messages ran before the slow one, %d acked: %d wait for it, bound %d", slow, acked, waiting, bound)
			}
			if st := c.Stats(); st.InFlight > n-(slow-bound) {
				t.Errorf("in flight %d while the slow message runs: finished messages hold their slots", st.InFlight)
			}
			close(release)
			if !src.waitSettled(n, 5*time.Second) {
				t.Fatalf("not all settled: %+v", c.Stats())
			}
		})
	}
}

// TestHandOffSingleFinishesAtOnce: with slow handlers every message goes to a
// worker alone and is finished as soon as it settled, so one long handler
// holds back nothing but its own key.
func TestHandOffSingleFinishesAtOnce(t *testing.T) {
	t.Parallel()
	const n = 20
	src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(n, n)...)
	started, release := make(chan struct{}), make(chan struct{})
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == "e1" {
			close(started)
			<-release
		}
		return nil
	})
	c := newPaced(t, src, h, consumer.Config{Concurrency: 2, MaxInFlight: n, ReceiveBatch: n}, "single")
	run(t, c)
	<-started
	if !src.waitSettled(n-1, 5*time.Second) {
		t.Fatalf("the other worker did not handle the rest while e1 runs: %+v", c.Stats())
	}
	// A message is acked, then finished (its in-flight slot freed); the
	// engine has no event for the finish, so its count is polled.
	deadline := time.Now().Add(5 * time.Second)
	for c.Stats().InFlight != 1 && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	if st := c.Stats(); st.InFlight != 1 {
		close(release)
		t.Fatalf("in flight %d while only e1 runs", st.InFlight)
	}
	close(release)
	if !src.waitSettled(n, 5*time.Second) {
		t.Fatalf("e1 not settled: %+v", c.Stats())
	}
}

// TestHandOffPaceFollowsHandlers: fast handlers are batched, slow ones go one
// at a time (spread over the workers), and fast ones are batched again.
func TestHandOffPaceFollowsHandlers(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{Delay: true})
	var slow atomic.Bool
	const conc = 4
	chk := newOrderChecker(t, conc)
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		chk.enter(m)
		defer chk.leave(m)
		if slow.Load() {
			time.Sleep(2 * time.Millisecond)
		}
		return nil
	})
	c := newPaced(t, src, h, consumer.Config{Concurrency: conc}, "adaptive")
	run(t, c)
	if got := consumer.PaceOf(c); got != "single" {
		t.Fatalf("pace %s before any message: want single", got)
	}
	total := 0
	// phase handles n messages, and n more up to 4 times while the pace is
	// not the one wanted: a worker descheduled for long on a loaded machine
	// looks like a slow handler for a while.
	phase := func(n int, wantSingle bool) {
		t.Helper()
		for try := 0; ; try++ {
			batch := msgs(n, 100)
			for i, m := range batch {
				m.ID = "p" + strconv.Itoa(total) + "-" + m.ID
				m.Payload = []byte(strconv.Itoa(total + i)) // arrival order across phases
			}
			total += n
			src.push(batch...)
			if !src.waitSettled(total, 20*time.Second) {
				t.Fatalf("not settled: %+v", c.Stats())
			}
			got := consumer.PaceOf(c)
			if (got == "single") == wantSingle {
				return
			}
			if try == 4 {
				t.Fatalf("after %d messages (slow %v): pace %s", (try+1)*n, slow.Load(), got)
			}
		}
	}
	phase(2000, false)
	slow.Store(true)
	chk.max.Store(0)
	phase(60, true)
	if m := chk.max.Load(); m < 2 {
		t.Errorf("slow handlers ran %d at a time: not spread over the workers", m)
	}
	slow.Store(false)
	phase(2000, false)
}

// TestHandOffDrainReleasesQueuedChunks: after the drain deadline, with a
// handler stuck past its cancelled context, every message not started is
// released at once — the rest of the stuck chunk, the chunks on the work
// queue and the messages behind them in their lanes — except those behind
// the stuck message in its own lane, which go when it returns.
func TestHandOffDrainReleasesQueuedChunks(t *testing.T) {
	t.Parallel()
	cases := []struct {
		pace     string
		received int // in flight when the drain starts
	}{
		// The worker is stuck on e0; the receive loop goes on: chunks of 4
		// queue up, then the second message of each key waits in its lane.
		{"batch", 40},
		// The receive loop runs e0 itself and is stuck: only its chunk.
		{"inline", 4},
	}
	for _, tc := range cases {
		t.Run(tc.pace, func(t *testing.T) {
			t.Parallel()
			const n, keys = 40, 20
			src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(n, keys)...)
			started, block := make(chan struct{}), make(chan struct{})
			h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
				if m.ID == "e0" {
					close(started)
					<-block // ignores ctx
				}
				return nil
			})
			c := newPaced(t, src, h, consumer.Config{Concurrency: 1, MaxInFlight: n, ReceiveBatch: 4, DrainTimeout: 20 * time.Millisecond}, tc.pace)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			<-started
			if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.InFlight == tc.received }) {
				t.Fatalf("in flight %d, want %d", c.Stats().InFlight, tc.received)
			}
			cancel()
			if err := <-done; !errors.Is(err, consumer.ErrDrainTimeout) {
				t.Fatalf("Run = %v, want ErrDrainTimeout", err)
			}
			// e0 and, in batch, e20 behind it (key k0) are still out.
			stuck := 1
			if tc.received == n {
				stuck = 2
			}
			src.mu.Lock()
			released, outstanding := len(src.released), src.outstanding
			src.mu.Unlock()
			if released != tc.received-stuck || outstanding != stuck {
				t.Fatalf("after Run returned: released %d, outstanding %d; want %d released, %d out", released, outstanding, tc.received-stuck, stuck)
			}
			if st := c.Stats(); st.InFlight != stuck {
				t.Fatalf("engine in flight %d, want %d", st.InFlight, stuck)
			}
			close(block)
			if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.InFlight == 0 }) {
				t.Fatalf("stuck messages never finished: %+v", c.Stats())
			}
			src.mu.Lock()
			defer src.mu.Unlock()
			if src.outstanding != 0 || len(src.acked) != 1 || src.acked[0].ID != "e0" {
				t.Fatalf("outstanding %d, acked %d: want only e0 acked and nothing out", src.outstanding, len(src.acked))
			}
		})
	}
}

// TestHandOffStalledBatchIsSpread: a message of a fast batch blocks. The
// messages of its batch not started yet are not held back behind it: the
// stall watch hands them to the other workers.
func TestHandOffStalledBatchIsSpread(t *testing.T) {
	t.Parallel()
	for _, pace := range []string{"batch", "inline"} {
		t.Run(pace, func(t *testing.T) {
			t.Parallel()
			const n = 40
			src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(n, n)...)
			started, release := make(chan struct{}), make(chan struct{})
			var fast atomic.Int64
			h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
				if m.ID == "e0" {
					close(started)
					<-release
				}
				fast.Add(1)
				return nil
			})
			c := newPaced(t, src, h, consumer.Config{Concurrency: 2, MaxInFlight: n, ReceiveBatch: n}, pace)
			run(t, c)
			<-started
			if !src.waitSettled(n-1, 5*time.Second) {
				t.Fatalf("%d of the %d other messages handled while e0 blocks: its batch was held back: %+v", fast.Load(), n-1, c.Stats())
			}
			close(release)
			if !src.waitSettled(n, 5*time.Second) {
				t.Fatalf("not all settled: %+v", c.Stats())
			}
		})
	}
}

// TestHandOffStuckWorkerFinishedMessagesAcked: the messages a worker ran
// before one that blocks are acked and their keys released while it blocks,
// not held until it returns: the stall watch finishes them.
func TestHandOffStuckWorkerFinishedMessagesAcked(t *testing.T) {
	t.Parallel()
	for _, pace := range []string{"batch", "inline"} {
		t.Run(pace, func(t *testing.T) {
			t.Parallel()
			const n, slow = 32, 5
			src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(n, n)...)
			started, release := make(chan struct{}), make(chan struct{})
			h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
				if m.ID == "e"+strconv.Itoa(slow) {
					close(started)
					<-release
				}
				return nil
			})
			// One worker and one receive of all n: one chunk of n.
			c := newPaced(t, src, h, consumer.Config{Concurrency: 1, MaxInFlight: n, ReceiveBatch: n}, pace)
			run(t, c)
			<-started
			// e0..e4 ran before e5 blocked; with one worker busy in e5 nothing
			// else runs, so exactly those five must be settled.
			if !src.waitSettled(slow, 5*time.Second) {
				t.Fatalf("finished messages not acked while e%d blocks: %+v", slow, c.Stats())
			}
			close(release)
			if !src.waitSettled(n, 5*time.Second) {
				t.Fatalf("not all settled: %+v", c.Stats())
			}
		})
	}
}

// failingBatchAck acks in batches and fails the ack of one message, as a
// broker that lost the message's partition would.
type failingBatchAck struct {
	*fakeSource
	bad string // the ID whose ack fails
}

func (s failingBatchAck) Extensions() adapters.Extensions {
	return adapters.Extensions{BatchAcker: s}
}

func (s failingBatchAck) AckBatch(ctx context.Context, msgs []*ackwise.Message, errs []error) {
	for i, m := range msgs {
		if m.ID == s.bad {
			errs[i] = errors.New("ack: not the owner any more")
			continue
		}
		errs[i] = s.Ack(ctx, m)
	}
}

// A message whose ack fails in a batch is counted SettleFailed and handed
// back (released), with the messages of its key queued behind it, unrun
// (they must not overtake its redelivery); the other messages are acked.
func TestBatchAckFailureReleases(t *testing.T) {
	for _, pace := range paces {
		t.Run(pace, func(t *testing.T) {
			in := msgs(20, 4) // e7's key k3 has e11, e15 and e19 behind it
			src := newFakeSource(adapters.Capabilities{}, in...)
			c := newPaced(t, failingBatchAck{src, in[7].ID}, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil }), consumer.Config{Concurrency: 2}, pace)
			run(t, c)
			if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.Acked+s.SettleFailed+s.Released == 20 && s.InFlight == 0 }) {
				t.Fatalf("stats %+v", c.Stats())
			}
			if st := c.Stats(); st.Acked != 16 || st.SettleFailed != 1 || st.Released != 3 {
				t.Fatalf("acked %d, settle failed %d, released %d; want 16, 1 and 3", st.Acked, st.SettleFailed, st.Released)
			}
			src.mu.Lock()
			defer src.mu.Unlock()
			var released []string
			for _, m := range src.released {
				released = append(released, m.ID)
			}
			if want := []string{"e7", "e11", "e15", "e19"}; !slices.Equal(released, want) || len(src.acked) != 16 {
				t.Fatalf("released %v (want %v), acked %d", released, want, len(src.acked))
			}
		})
	}
}
