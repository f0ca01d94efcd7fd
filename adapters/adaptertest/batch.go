package adaptertest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// The cases below run a batch handler (consumer.NewBatch) on the broker:
// per-message outcomes settle each message alone, a poison message is
// dead-lettered alone whether its batch reports it (a *BatchError) or fails
// as a whole, and per-key order holds across batches.

// batchLinger is the Batch.Linger of the cases: long enough for the
// messages published beforehand to share batches on a broker that hands
// them out a few at a time (pstest: about one per 10 ms per stream).
const batchLinger = 100 * time.Millisecond

// batchRec records what a batch handler saw and what the engine settled
// through a source wrapped by counting, per event ID.
type batchRec struct {
	progress
	size     int        // Batch.Size
	batches  [][]string // the IDs of each call, in the order called
	runs     map[string]int
	handled  map[string]int   // the calls it succeeded in
	attempt  map[string]int   // Attempt of the call it succeeded in
	order    map[string][]int // per key, x-seq of the messages in the order they succeeded
	active   map[string]bool  // keys in a call running now
	bad      []string         // a batch too large, a key twice in one, a key in two at once
	acked    map[string]int
	dead     map[string]int
	nacked   int
	released int
}

func (h Harness) newBatchRec(size int) *batchRec {
	return &batchRec{progress: h.newProgress(), size: size,
		runs: map[string]int{}, handled: map[string]int{}, attempt: map[string]int{}, order: map[string][]int{},
		active: map[string]bool{}, acked: map[string]int{}, dead: map[string]int{}}
}

// handler returns a batch handler that runs fn and records the call and
// the outcome of each of its messages.
func (r *batchRec) handler(fn func(context.Context, []*ackwise.Message) error) ackwise.BatchHandler {
	return ackwise.BatchHandlerFunc(func(ctx context.Context, msgs []*ackwise.Message) error {
		r.begin(msgs)
		err := fn(ctx, msgs)
		r.end(msgs, err)
		return err
	})
}

func (r *batchRec) begin(msgs []*ackwise.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(msgs) > r.size {
		r.bad = append(r.bad, fmt.Sprintf("a batch of %d, Batch.Size %d", len(msgs), r.size))
	}
	ids := make([]string, len(msgs))
	keys := make(map[string]bool, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
		r.runs[m.ID]++
		switch {
		case keys[m.Key]:
			r.bad = append(r.bad, fmt.Sprintf("key %s twice in one batch (%s)", m.Key, m.ID))
		case r.active[m.Key]:
			r.bad = append(r.bad, fmt.Sprintf("key %s in two batches at once (%s)", m.Key, m.ID))
		}
		keys[m.Key] = true
		r.active[m.Key] = true
	}
	r.batches = append(r.batches, ids)
}

func (r *batchRec) end(msgs []*ackwise.Message, err error) {
	errs := make([]error, len(msgs))
	ackwise.BatchOutcomes(err, errs)
	r.mu.Lock()
	for i, m := range msgs {
		r.active[m.Key] = false
		if errs[i] != nil {
			continue
		}
		r.handled[m.ID]++
		r.attempt[m.ID] = m.Attempt
		seq, _ := strconv.Atoi(m.Headers.Get("x-seq"))
		r.order[m.Key] = append(r.order[m.Key], seq)
	}
	r.mu.Unlock()
	r.signal()
}

// requireBatched fails t unless some batch held several messages, and
// logs how the messages were batched. Call with mu held.
func (r *batchRec) requireBatched(t *testing.T) {
	t.Helper()
	b, total := 0, 0
	for _, ids := range r.batches {
		b = max(b, len(ids))
		total += len(ids)
	}
	if b < 2 {
		t.Fatalf("the largest batch held %d message(s): nothing was batched (%d calls)", b, len(r.batches))
	}
	t.Logf("%d batch calls for %d runs of a message, the largest of %d (Batch.Size %d)", len(r.batches), total, b, r.size)
}

// counting wraps src so that r counts the settles the engine makes that
// the source took (nil error), per event ID.
func (r *batchRec) counting(src adapters.Source) adapters.Source {
	return &settleCounter{Source: src, rec: r, acker: src.Extensions().BatchAcker}
}

// settleCounter counts a source's settles into rec. It keeps the source's
// BatchAcker, wrapped, so that the engine acks as it would on the source
// alone.
type settleCounter struct {
	adapters.Source
	rec   *batchRec
	acker adapters.BatchAcker
}

func (s *settleCounter) count(ids []string, errs []error, to func(id string)) {
	s.rec.mu.Lock()
	for i, id := range ids {
		if errs[i] == nil {
			to(id)
		}
	}
	s.rec.mu.Unlock()
	s.rec.signal()
}

func (s *settleCounter) Ack(ctx context.Context, m *ackwise.Message) error {
	id := m.ID
	err := s.Source.Ack(ctx, m)
	s.count([]string{id}, []error{err}, func(id string) { s.rec.acked[id]++ })
	return err
}

func (s *settleCounter) AckBatch(ctx context.Context, msgs []*ackwise.Message, errs []error) {
	ids := ids(msgs)
	s.acker.AckBatch(ctx, msgs, errs)
	s.count(ids, errs, func(id string) { s.rec.acked[id]++ })
}

func (s *settleCounter) DeadLetter(ctx context.Context, m *ackwise.Message, env dlq.Envelope) error {
	id := m.ID
	err := s.Source.DeadLetter(ctx, m, env)
	s.count([]string{id}, []error{err}, func(id string) { s.rec.dead[id]++ })
	return err
}

func (s *settleCounter) Nack(ctx context.Context, m *ackwise.Message, d time.Duration) error {
	id := m.ID
	err := s.Source.Nack(ctx, m, d)
	s.count([]string{id}, []error{err}, func(string) { s.rec.nacked++ })
	return err
}

func (s *settleCounter) Release(ctx context.Context, m *ackwise.Message) error {
	id := m.ID
	err := s.Source.Release(ctx, m)
	s.count([]string{id}, []error{err}, func(string) { s.rec.released++ })
	return err
}

// Extensions replaces BatchAcker with the counter's, which acks through
// the source's own.
func (s *settleCounter) Extensions() adapters.Extensions {
	ext := s.Source.Extensions()
	if ext.BatchAcker != nil {
		ext.BatchAcker = s
	}
	return ext
}

// startBatch runs a batch consumer on src until the test ends or stop is
// called.
func (h Harness) startBatch(t *testing.T, src adapters.Source, bh ackwise.BatchHandler, cfg consumer.Config) (stop func() error) {
	t.Helper()
	c, err := consumer.NewBatch(src, bh, cfg)
	if err != nil {
		t.Fatalf("consumer.NewBatch: %v", err)
	}
	return h.run(t, c)
}

// requireSettledForGood stops the consumer on src and closes src, then
// checks on a new source (a restart) that what src settled stays settled:
// a marker published now is delivered, nothing before it, and nothing
// after it within the source's lease and a half (half a second where
// deliveries have no lease).
func (h Harness) requireSettledForGood(t *testing.T, f Fixture, src adapters.Source, stop func() error) {
	t.Helper()
	if err := stop(); err != nil {
		t.Fatalf("consumer: %v", err)
	}
	wait := 500 * time.Millisecond
	if lease := src.Capabilities().Lease; lease > 0 {
		wait = max(wait, lease*3/2)
	}
	if err := src.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	marker := batch(1, 1)
	h.publish(t, f, marker)
	next := f.NewSource(t)
	m := h.receiveOne(t, next)
	if m.ID != marker[0].ID {
		t.Fatalf("%s (attempt %d) delivered again after a restart: the first consumer settled it", m.ID, m.Attempt)
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	if err := next.Ack(ctx, m); err != nil {
		t.Fatalf("ack the marker: %v", err)
	}
	requireNothingMore(ctx, t, next, wait, "after a restart: the first consumer settled it")
}

// testBatchPoisonAlone: a batch handler reports the poison message of its
// batch permanently failed (a *BatchError): it alone is dead-lettered,
// with a permanent failure's envelope, and each other message of its batch
// is acked once, at its first attempt.
func testBatchPoisonAlone(t *testing.T, h Harness) {
	h.batchPoison(t, false, func(poison string) func(context.Context, []*ackwise.Message) error {
		return func(_ context.Context, msgs []*ackwise.Message) error {
			be := ackwise.NewBatchError(len(msgs))
			for i, m := range msgs {
				if m.ID == poison {
					be.Set(i, fmt.Errorf("row %s: %w", m.ID, ackwise.Permanent(errors.New("invalid input syntax"))))
				}
			}
			return be.Err()
		}
	})
}

// testBatchWholeFailureIsolates: a batch handler fails its whole batch
// with one permanent error whenever the poison message is in it. The
// engine runs that batch's messages again one at a time: the poison alone
// is dead-lettered, and its batch-mates are acked once, at their first
// attempt (the failed batch spent none of theirs).
func testBatchWholeFailureIsolates(t *testing.T, h Harness) {
	h.batchPoison(t, true, func(poison string) func(context.Context, []*ackwise.Message) error {
		return func(_ context.Context, msgs []*ackwise.Message) error {
			for _, m := range msgs {
				if m.ID == poison {
					return fmt.Errorf("bulk insert of %d rows: %w", len(msgs), ackwise.Permanent(errors.New("invalid input syntax")))
				}
			}
			return nil
		}
	})
}

// batchPoison publishes messages of distinct keys, one of them poison, and
// runs a batch consumer with the handler fail makes for the poison's ID;
// whole says the handler fails the poison's batch as a whole. It checks
// batches formed, the poison alone was dead-lettered (at attempt 1, reason
// permanent), every other message succeeded once at attempt 1 and was
// acked once, and nothing comes back after a restart.
func (h Harness) batchPoison(t *testing.T, whole bool, fail func(poison string) func(context.Context, []*ackwise.Message) error) {
	const n, size = 60, 20
	f := h.Open(t, FixtureConfig{Lease: time.Second, Partitions: 2})
	in := batch(n, n)
	poison := in[n/2].ID
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	// One Publish call: each message has its own key, so their order is
	// of no account.
	if err := f.Sink.Publish(ctx, in...); err != nil {
		t.Fatalf("publish: %v", err)
	}
	rec := h.newBatchRec(size)
	src := rec.counting(f.NewSource(t))
	stop := h.startBatch(t, src, rec.handler(fail(poison)), consumer.Config{Concurrency: 2,
		Batch: consumer.BatchConfig{Size: size, Linger: batchLinger}})
	rec.waitFor(t, "every message acked or dead-lettered", func() bool {
		for _, m := range in {
			if rec.acked[m.ID]+rec.dead[m.ID] == 0 {
				return false
			}
		}
		return true
	})
	h.requireSettledForGood(t, f, src, stop)

	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.bad) > 0 {
		t.Fatalf("batches broke their bounds %d times: %v", len(rec.bad), rec.bad[:min(len(rec.bad), 5)])
	}
	rec.requireBatched(t)
	// The calls that held the poison: its batch (and, when the batch failed
	// as a whole, then it alone).
	var withPoison [][]string
	for _, ids := range rec.batches {
		for _, id := range ids {
			if id == poison {
				withPoison = append(withPoison, ids)
			}
		}
	}
	mates := map[string]bool{}
	if whole {
		if len(withPoison) != 2 || len(withPoison[0]) < 2 || len(withPoison[1]) != 1 {
			t.Fatalf("the poison ran in batches of %v, want its batch of several, then alone", lens(withPoison))
		}
		for _, id := range withPoison[0] {
			mates[id] = id != poison
		}
	} else if len(withPoison) != 1 {
		t.Fatalf("the poison ran in %d calls, want 1: its own failure is final", len(withPoison))
	}
	for _, m := range in {
		id := m.ID
		if id == poison {
			if rec.handled[id] != 0 || rec.dead[id] != 1 || rec.acked[id] != 0 {
				t.Fatalf("poison %s: succeeded %d, dead-lettered %d, acked %d times, want dead-lettered once alone", id, rec.handled[id], rec.dead[id], rec.acked[id])
			}
			continue
		}
		runs := 1
		if mates[id] {
			runs = 2 // the failed batch, then alone
		}
		switch {
		case rec.runs[id] != runs:
			t.Fatalf("%s ran in %d calls, want %d (a batch-mate of the poison: %v)", id, rec.runs[id], runs, mates[id])
		case rec.handled[id] != 1 || rec.attempt[id] != 1:
			t.Fatalf("%s succeeded %d times (attempt %d), want once at attempt 1", id, rec.handled[id], rec.attempt[id])
		case rec.acked[id] != 1 || rec.dead[id] != 0:
			t.Fatalf("%s acked %d, dead-lettered %d times, want acked once", id, rec.acked[id], rec.dead[id])
		}
	}
	if rec.nacked != 0 {
		t.Fatalf("%d retries, want none: only the poison failed, for good", rec.nacked)
	}

	dl := h.waitDeadLetters(t, f, 1)
	if len(dl) != 1 || dl[0].Headers.Get(ackwise.HeaderEventID) != poison {
		t.Fatalf("dead letters %v, want %s alone", eventIDs(dl), poison)
	}
	env, err := dlq.Decode(dl[0].Headers)
	if err != nil {
		t.Fatal(err)
	}
	if env.Reason != dlq.ReasonPermanent || env.ErrorClass != "permanent" || env.Attempts != 1 {
		t.Fatalf("envelope reason %q class %q attempts %d, want permanent, permanent, 1", env.Reason, env.ErrorClass, env.Attempts)
	}
}

// lens returns the sizes of batches.
func lens(batches [][]string) []int {
	out := make([]int, len(batches))
	for i, b := range batches {
		out[i] = len(b)
	}
	return out
}

// eventIDs returns the event ID header of each of msgs (dead letters carry
// the original's).
func eventIDs(msgs []*ackwise.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Headers.Get(ackwise.HeaderEventID)
	}
	return out
}

// orderedRetries says whether the engine's default retry mode
// (consumer.RetryAuto) keeps per-key order on a source with caps: the
// source delivers keys in order, and a failed message waits in place,
// holding back its key, rather than going through the broker's delay
// tiers (retry topics, wait queues), where it leaves its key's order.
func orderedRetries(caps adapters.Capabilities) bool {
	tiered := caps.Delay && len(caps.DelayTiers) > 0
	return caps.Ordered && !tiered
}

// testBatchKeyOrder: batches of several keys, some messages failing
// (transiently, once) and retried: a batch holds at most one message of a
// key and a key is in one running batch at a time; every message succeeds
// once and is acked once; and where the source delivers keys in order and
// retries wait in place (orderedRetries), each key's messages succeed in
// publish order.
func testBatchKeyOrder(t *testing.T, h Harness) {
	const n, keys, size = 160, 16, 8
	flaky := func(seq int) bool { return seq%40 == 7 }
	f := h.Open(t, FixtureConfig{Partitions: 3})
	in := batch(n, keys)
	for i, m := range in {
		// Two in a row of each key: a batch of messages taken in the
		// order received, whatever their keys, would hold a key twice.
		m.Key = fmt.Sprintf("key-%d", i/2%keys)
	}
	h.publish(t, f, in)
	rec := h.newBatchRec(size)
	src := rec.counting(f.NewSource(t))
	caps := src.Capabilities()
	fn := func(_ context.Context, msgs []*ackwise.Message) error {
		be := ackwise.NewBatchError(len(msgs))
		for i, m := range msgs {
			if seq, _ := strconv.Atoi(m.Headers.Get("x-seq")); flaky(seq) && m.Attempt == 1 {
				be.Set(i, errors.New("deadlock detected"))
			}
		}
		return be.Err()
	}
	stop := h.startBatch(t, src, rec.handler(fn), consumer.Config{Concurrency: 4,
		Retry: retry.Policy{InitialInterval: 50 * time.Millisecond, Jitter: retry.NoJitter},
		Batch: consumer.BatchConfig{Size: size, Linger: batchLinger}})
	rec.waitFor(t, "every message acked", func() bool {
		for _, m := range in {
			if rec.acked[m.ID] == 0 {
				return false
			}
		}
		return true
	})
	if err := stop(); err != nil {
		t.Fatalf("consumer: %v", err)
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.bad) > 0 {
		t.Fatalf("batches broke their bounds %d times: %v", len(rec.bad), rec.bad[:min(len(rec.bad), 5)])
	}
	rec.requireBatched(t)
	for i, m := range in {
		runs := 1
		if flaky(i) {
			runs = 2
		}
		id := m.ID
		switch {
		case rec.runs[id] != runs:
			t.Fatalf("%s ran %d times, want %d", id, rec.runs[id], runs)
		case rec.handled[id] != 1:
			t.Fatalf("%s succeeded %d times, want once", id, rec.handled[id])
		case rec.acked[id] != 1 || rec.dead[id] != 0:
			t.Fatalf("%s acked %d, dead-lettered %d times, want acked once", id, rec.acked[id], rec.dead[id])
		}
	}
	if !orderedRetries(caps) {
		t.Logf("per-key order not checked: the source does not deliver keys in order (Ordered %v), or retries go through its delay tiers %v; checked one batch per key at a time", caps.Ordered, caps.DelayTiers)
		return
	}
	for k, seqs := range rec.order {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] < seqs[i-1] {
				t.Fatalf("key %s: message %d succeeded after %d (order %v)", k, seqs[i], seqs[i-1], seqs)
			}
		}
	}
}
