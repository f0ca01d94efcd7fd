package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// batchLog records the batches a batch handler was called with.
type batchLog struct {
	mu      sync.Mutex
	batches [][]string // message IDs
	runs    map[string]int
	order   map[string][]int // per key, the payload sequence numbers in the order handled
}

func (l *batchLog) record(msgs []*ackwise.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.runs == nil {
		l.runs, l.order = map[string]int{}, map[string][]int{}
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
		l.runs[m.ID]++
	}
	l.batches = append(l.batches, ids)
}

// TestBatchHandlerKeepsKeyOrder: batches never exceed Size, never hold two
// messages of a key, and each key's messages are handled in the order
// received; every message is acked once.
func TestBatchHandlerKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	const n, keys, size = 3000, 40, 64
	src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(n, keys)...)
	var log batchLog
	var bad atomic.Value
	h := ackwise.BatchHandlerFunc(func(_ context.Context, ms []*ackwise.Message) error {
		if len(ms) > size {
			bad.Store(fmt.Sprintf("batch of %d, Size %d", len(ms), size))
		}
		seen := map[string]bool{}
		for _, m := range ms {
			if seen[m.Key] {
				bad.Store("key " + m.Key + " twice in one batch")
			}
			seen[m.Key] = true
		}
		log.record(ms)
		log.mu.Lock()
		for _, m := range ms {
			seq, _ := strconv.Atoi(string(m.Payload))
			log.order[m.Key] = append(log.order[m.Key], seq)
		}
		log.mu.Unlock()
		return nil
	})
	c, err := consumer.NewBatch(src, h, consumer.Config{Concurrency: 4, Batch: consumer.BatchConfig{Size: size}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	if !src.waitSettled(n, 60*time.Second) {
		t.Fatalf("settled %d of %d", c.Stats().Acked, n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if b := bad.Load(); b != nil {
		t.Fatal(b)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	biggest := 0
	for _, b := range log.batches {
		biggest = max(biggest, len(b))
	}
	if biggest < 2 {
		t.Errorf("largest batch held %d message(s): nothing was batched", biggest)
	}
	for k, seqs := range log.order {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] < seqs[i-1] {
				t.Fatalf("key %s: %d handled after %d", k, seqs[i], seqs[i-1])
			}
		}
	}
	if got := c.Stats().Acked; got != n {
		t.Errorf("acked %d, want %d", got, n)
	}
	for id, r := range log.runs {
		if r != 1 {
			t.Errorf("%s ran %d times", id, r)
		}
	}
	t.Logf("%d batches, largest %d", len(log.batches), biggest)
}

// TestBatchPerMessageOutcomes: a BatchError settles each message by its own
// entry: the poison message is dead-lettered alone, a transient failure is
// retried, a discard is acked, the rest are acked once.
func TestBatchPerMessageOutcomes(t *testing.T) {
	t.Parallel()
	ms := msgs(200, 200)
	ms[17].Payload = []byte("poison")
	ms[42].Payload = []byte("flaky")
	ms[99].Payload = []byte("drop")
	src := newFakeSource(adapters.Capabilities{Delay: true}, ms...)
	var log batchLog
	h := ackwise.BatchHandlerFunc(func(_ context.Context, ms []*ackwise.Message) error {
		log.record(ms)
		be := ackwise.NewBatchError(len(ms))
		for i, m := range ms {
			switch string(m.Payload) {
			case "poison":
				be.Set(i, ackwise.Permanent(errors.New("cannot parse")))
			case "flaky":
				if m.Attempt == 1 {
					be.Set(i, errors.New("deadlock detected"))
				}
			case "drop":
				be.Set(i, ackwise.Discard(errors.New("stale")))
			}
		}
		return be.Err()
	})
	c, err := consumer.NewBatch(src, h, consumer.Config{Concurrency: 2, Batch: consumer.BatchConfig{Size: 50}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	// 197 acked, the discard acked, one dead letter, one nack.
	if !src.waitSettled(200, 30*time.Second) {
		t.Fatalf("stats %+v", c.Stats())
	}
	nacked := src.nackedMsgs()
	if len(nacked) != 1 || nacked[0] != ms[42] {
		t.Fatalf("nacked %v, want the flaky message alone", nacked)
	}
	ms[42].Attempt = 2
	src.push(ms[42]) // the broker's redelivery
	if !src.waitSettled(201, 30*time.Second) {
		t.Fatalf("the retry did not settle: %+v", c.Stats())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.DeadLettered != 1 || st.Discarded != 1 || st.Retried != 1 || st.Acked != 198 {
		t.Errorf("stats %+v: want 1 dead-lettered, 1 discarded, 1 retried, 198 acked", st)
	}
	dead := src.deadMsgs()
	if len(dead) != 1 || dead[0].msg != ms[17] || dead[0].env.Reason != dlq.ReasonPermanent {
		t.Fatalf("dead letters %v, want the poison message alone, reason permanent", dead)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	for id, r := range log.runs {
		if want := map[bool]int{true: 2, false: 1}[id == ms[42].ID]; r != want {
			t.Errorf("%s ran %d times, want %d", id, r, want)
		}
	}
}

// TestBatchWholeFailureIsolatesPoison: a batch that panics as a whole runs
// again one message at a time, so only the message that panics alone is
// dead-lettered; its batch-mates are acked once and spend no attempt.
func TestBatchWholeFailureIsolatesPoison(t *testing.T) {
	t.Parallel()
	for _, fail := range []string{"panic", "error"} {
		t.Run(fail, func(t *testing.T) {
			t.Parallel()
			ms := msgs(120, 120)
			ms[33].Payload = []byte("poison")
			src := newFakeSource(adapters.Capabilities{Delay: true}, ms...)
			var log batchLog
			var effects sync.Map
			h := ackwise.BatchHandlerFunc(func(_ context.Context, ms []*ackwise.Message) error {
				log.record(ms)
				for _, m := range ms {
					if string(m.Payload) == "poison" {
						if fail == "panic" {
							panic("nil map in the row builder")
						}
						return ackwise.Permanent(errors.New("bulk insert: invalid input syntax"))
					}
				}
				for _, m := range ms {
					if _, dup := effects.LoadOrStore(m.ID, true); dup {
						t.Errorf("effect of %s applied twice", m.ID)
					}
				}
				return nil
			})
			c, err := consumer.NewBatch(src, h, consumer.Config{Concurrency: 2, Batch: consumer.BatchConfig{Size: 40}})
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, c)
			if !src.waitSettled(120, 30*time.Second) {
				t.Fatalf("stats %+v", c.Stats())
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			dead := src.deadMsgs()
			if len(dead) != 1 || dead[0].msg != ms[33] {
				t.Fatalf("dead-lettered %d message(s), want the poison one alone", len(dead))
			}
			if st := c.Stats(); st.Acked != 119 || st.Retried != 0 {
				t.Errorf("stats %+v: want 119 acked, none retried", st)
			}
			if fail == "panic" {
				if !strings.Contains(dead[0].env.Error, "nil map") {
					t.Errorf("dead letter's error %q, want the panic's", dead[0].env.Error)
				}
			}
			log.mu.Lock()
			defer log.mu.Unlock()
			if r := log.runs[ms[33].ID]; r != 2 {
				t.Errorf("poison ran %d times, want 2 (its batch, then alone)", r)
			}
		})
	}
}

// TestBatchLingerFillsBatches: messages received one by one within the
// linger share a batch; a batch not full is handed off when the linger
// ends, on the consumer's clock.
func TestBatchLingerFillsBatches(t *testing.T) {
	t.Parallel()
	clock := memory.NewVirtualClock(time.Time{})
	src := newFakeSource(adapters.Capabilities{Delay: true})
	batches := make(chan []string, 10)
	h := ackwise.BatchHandlerFunc(func(_ context.Context, ms []*ackwise.Message) error {
		ids := make([]string, len(ms))
		for i, m := range ms {
			ids[i] = m.ID
		}
		batches <- ids
		return nil
	})
	c, err := consumer.NewBatch(src, h, consumer.Config{Concurrency: 2, ReceiveBatch: 1, Clock: clock,
		Batch: consumer.BatchConfig{Size: 10, Linger: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	ms := msgs(3, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, m := range ms {
		src.push(m)
		if i == 0 {
			// The first message arms the linger timer.
			if err := clock.WaitForTimers(ctx, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !src.waitUntil(30*time.Second, func() bool { return len(src.queue) == 0 }) {
		t.Fatal("messages not received")
	}
	select {
	case b := <-batches:
		t.Fatalf("batch %v handed off before the linger ended", b)
	default:
	}
	clock.Advance(time.Second)
	select {
	case b := <-batches:
		if len(b) != 3 {
			t.Fatalf("batch %v, want the 3 messages together", b)
		}
	case <-ctx.Done():
		t.Fatal("no batch after the linger")
	}
	if !src.waitSettled(3, 30*time.Second) {
		t.Fatal("not acked")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestBatchDrainReleasesLingering: messages waiting for their batch to fill
// when the consumer stops are released, not run, and Run returns at once.
func TestBatchDrainReleasesLingering(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(5, 5)...)
	var calls atomic.Int64
	h := ackwise.BatchHandlerFunc(func(context.Context, []*ackwise.Message) error { calls.Add(1); return nil })
	c, err := consumer.NewBatch(src, h, consumer.Config{Batch: consumer.BatchConfig{Size: 100, Linger: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	if !src.waitUntil(30*time.Second, func() bool { return len(src.queue) == 0 }) {
		t.Fatal("messages not received")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !src.waitReleased(5, 30*time.Second) {
		t.Fatalf("released %d, want 5", len(src.releasedMsgs()))
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("handler called %d times during the drain", n)
	}
}

func TestNewBatchConfigErrors(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{Delay: true})
	bh := ackwise.BatchHandlerFunc(func(context.Context, []*ackwise.Message) error { return nil })
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })
	mw := func(next ackwise.Handler) ackwise.Handler { return next }
	for _, tc := range []struct {
		name string
		new  func() error
		want string
	}{
		{"nil handler", func() error { _, err := consumer.NewBatch(src, nil, consumer.Config{}); return err }, "batch handler is nil"},
		{"handler inbox", func() error {
			_, err := consumer.NewBatch(src, bh, consumer.Config{Inbox: mw})
			return err
		}, "Batch.Inbox"},
		{"handler middleware", func() error {
			_, err := consumer.NewBatch(src, bh, consumer.Config{Middleware: []ackwise.Middleware{mw}})
			return err
		}, "Batch.Middleware"},
		{"negative size", func() error {
			_, err := consumer.NewBatch(src, bh, consumer.Config{Batch: consumer.BatchConfig{Size: -1}})
			return err
		}, "Batch.Size = -1"},
		{"size over in-flight", func() error {
			_, err := consumer.NewBatch(src, bh, consumer.Config{MaxInFlight: 10, Batch: consumer.BatchConfig{Size: 11}})
			return err
		}, "MaxInFlight = 10 is below Batch.Size = 11"},
		{"bad linger", func() error {
			_, err := consumer.NewBatch(src, bh, consumer.Config{Batch: consumer.BatchConfig{Linger: -2}})
			return err
		}, "Batch.Linger"},
		{"batch for New", func() error {
			_, err := consumer.New(src, h, consumer.Config{Batch: consumer.BatchConfig{Size: 10}})
			return err
		}, "NewBatch"},
	} {
		err := tc.new()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
	c, err := consumer.NewBatch(src, bh, consumer.Config{Batch: consumer.BatchConfig{Size: 500}})
	if err != nil {
		t.Fatalf("defaults for Size 500: %v", err)
	}
	_ = c
}

// unhashableErr is comparable as a type but holds a value that cannot be
// hashed: sharedFailures must not panic on it.
type unhashableErr struct{ v any }

func (e unhashableErr) Error() string { return fmt.Sprint("unhashable ", e.v) }

// TestBatchSharedErrorsRunAlone: entries of a BatchError that hold one
// and the same error value failed together (as a batch middleware passes a
// whole-batch error on): those messages run again alone, and only the one
// that fails alone is dead-lettered; distinct errors, and errors that
// cannot be compared, are settled as returned.
func TestBatchSharedErrorsRunAlone(t *testing.T) {
	t.Parallel()
	ms := msgs(30, 30)
	ms[4].Payload = []byte("poison")
	ms[9].Payload = []byte("odd")
	ms[11].Payload = []byte("odd")
	src := newFakeSource(adapters.Capabilities{Delay: true}, ms...)
	var log batchLog
	h := ackwise.BatchHandlerFunc(func(_ context.Context, ms []*ackwise.Message) error {
		log.record(ms)
		poisoned := false
		for _, m := range ms {
			poisoned = poisoned || string(m.Payload) == "poison"
		}
		shared := ackwise.Permanent(errors.New("bulk insert failed"))
		out := ackwise.NewBatchError(len(ms))
		for i, m := range ms {
			switch {
			case string(m.Payload) == "odd":
				// Its own error, transient, which cannot be hashed:
				// settled as returned.
				out.Set(i, unhashableErr{[]int{i}})
			case poisoned:
				out.Set(i, shared) // the batch failed together
			}
		}
		return out.Err()
	})
	c, err := consumer.NewBatch(src, h, consumer.Config{Concurrency: 1, Batch: consumer.BatchConfig{Size: 30, Linger: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	if !src.waitSettled(30, 30*time.Second) {
		t.Fatalf("stats %+v", c.Stats())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	dead := map[string]bool{}
	for _, d := range src.deadMsgs() {
		dead[d.msg.ID] = true
	}
	if len(dead) != 1 || !dead[ms[4].ID] {
		t.Fatalf("dead-lettered %v, want the poison alone", dead)
	}
	if nacked := src.nackedMsgs(); len(nacked) != 2 {
		t.Fatalf("retried %d, want the two odd messages", len(nacked))
	}
	if st := c.Stats(); st.Acked != 27 {
		t.Errorf("stats %+v, want 27 acked", st)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if r := log.runs[ms[9].ID]; r != 1 {
		t.Errorf("odd message ran %d times, want once: its error was its own", r)
	}
	if r := log.runs[ms[0].ID]; r != 2 {
		t.Errorf("a batch-mate of the poison ran %d times, want 2 (its batch, then alone)", r)
	}
}

// TestBatchBreakerOutage: while the dependency is down every batch fails
// as a whole, and its messages, run again alone, fail too; the breaker
// opens after Threshold failures and holds the messages instead of
// spending their attempts, probes, and once the dependency is back every
// held message is acked once and none is dead-lettered.
func TestBatchBreakerOutage(t *testing.T) {
	t.Parallel()
	const n = 200
	src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(n, 50)...)
	var down atomic.Bool
	down.Store(true)
	var calls, failed atomic.Int64
	tripped := make(chan struct{}) // enough failed calls to open the breaker
	h := ackwise.BatchHandlerFunc(func(_ context.Context, ms []*ackwise.Message) error {
		if calls.Add(1) > 1000 {
			t.Error("more than 1,000 calls: the breaker does not hold the messages")
		}
		if down.Load() {
			// Settled failures in a row open the breaker at 3: with two
			// workers, at least 8 of the first 10 are settled.
			if failed.Add(1) == 10 {
				close(tripped)
			}
			return errors.New("connection refused")
		}
		return nil
	})
	c, err := consumer.NewBatch(src, h, consumer.Config{
		Concurrency: 2,
		Retry:       retry.Policy{MaxAttempts: 3, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond},
		Breaker:     &consumer.Breaker{Threshold: 3, ProbeInterval: 10 * time.Millisecond, MaxProbeInterval: 20 * time.Millisecond},
		Batch:       consumer.BatchConfig{Size: 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	select {
	case <-tripped:
	case <-time.After(30 * time.Second): // a hang detector
		t.Fatalf("the handler failed %d times in 30s", failed.Load())
	}
	down.Store(false)
	if !src.waitSettled(n, 60*time.Second) {
		t.Fatalf("settled %d of %d after the outage: %+v", len(src.acked), n, c.Stats())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// The failures before the breaker opened spent an attempt each (here
	// a nack to the broker, which this fake does not redeliver), as for a
	// Handler; every message after them was held, not failed.
	st := c.Stats()
	if st.DeadLettered != 0 || st.Acked+st.Retried != n || st.Retried >= 10 || st.BreakerTrips == 0 {
		t.Errorf("stats %+v: want the %d messages acked but for the few retried before the breaker opened, none dead-lettered", st, n)
	}
	t.Logf("calls %d (failed %d), stats %+v", calls.Load(), failed.Load(), st)
}
