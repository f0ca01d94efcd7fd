package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// stressSeeds is how many seeds TestStressLog runs (a quarter of them with
// -short, the offline unit run); each is a subtest named seed=N, so one is
// replayed with -run 'TestStressLog/seed=N$'.
const stressSeeds = 200

// Message classes of the stress test, fixed per record: its handler outcome
// depends on the record and on how often it ran before, never on timing.
const (
	classGood     = iota // succeeds
	classFlaky           // fails transiently a time or two, then succeeds
	classPoison          // fails permanently: dead-lettered
	classHopeless        // always fails transiently: dead-lettered at max-attempts
	classDiscard         // discarded: acked without an effect
	classLater           // fails with RetryAfter a time or two, then succeeds
	classPanic           // panics a time or two (every time unless panics are retried), then succeeds
	classSlow            // succeeds, its first run slower than the lease
)

// TestStressLog runs the engine, ordered by key with several workers, on a
// memory log under seeded random conditions: handler outcomes of every
// class, injected faults (lost, failed and crashing acks, duplicates,
// reordered batches, failing dead letters), the breaker, and stops and
// restarts midway (the same member run again, or a new one that re-reads
// from the committed offsets). The faults are then removed and a last run
// goes on until every partition is committed to its end. It checks, none
// of it depending on timing:
//   - nothing is lost: every record is committed, a good one acked after a
//     success, a poison or hopeless one dead-lettered and never acked, a
//     flaky one one or the other;
//   - an ack follows a success of the same delivery, and no delivery is
//     handled after it was acked or dead-lettered (a record is handled again
//     only through another delivery: a duplicate, a redelivery, a re-read);
//   - a key's messages run one at a time;
//   - unless a batch was reordered (the broker itself then changed the
//     arrival order), each key's records are first settled (acked, dead
//     lettered, or acked with the ack lost on the way) in offset order, and
//     the first successful effects of its never dead-lettered records come
//     in offset order too;
//   - every run ends, and drains cleanly.
func TestStressLog(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= shortScaled(stressSeeds); seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			stressLog(t, seed)
		})
	}
}

// stressRecord is what the test knows of a published record.
type stressRecord struct {
	id, key string
	part    int32
	off     int64
	class   int
	fails   int // classFlaky, classLater, classPanic: failures before the first success
	payload []byte
	// sleep is how long classSlow's first run takes; after is classLater's
	// RetryAfter.
	sleep, after time.Duration
}

// stressWorld is the handler's and the observer's shared record of what ran.
type stressWorld struct {
	recs  map[string]*stressRecord // by event ID
	mu    sync.Mutex
	calls map[string]int             // handler calls per event ID
	runs  map[string]bool            // consumer/key pairs with a handler running
	last  map[*ackwise.Message]error // each delivery's last handler result
	done  map[*ackwise.Message]consumer.Outcome
	// effects lists, per key, the event IDs in the order of their
	// successful handler runs.
	effects map[string][]string
	bad     []string // violations seen as they happened
}

func (w *stressWorld) fail(format string, args ...any) {
	w.bad = append(w.bad, fmt.Sprintf(format, args...))
}

func (w *stressWorld) Handle(ctx context.Context, m *ackwise.Message) error {
	return w.handle(ctx, "", m)
}

// handler is the handler of the consumer named who: a key's messages run
// one at a time within one consumer (competing consumers of a queue may
// each run a message of the key).
func (w *stressWorld) handler(who string) ackwise.Handler {
	return ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error { return w.handle(ctx, who, m) })
}

func (w *stressWorld) handle(_ context.Context, who string, m *ackwise.Message) (err error) {
	r := w.recs[m.ID]
	w.mu.Lock()
	if r == nil {
		w.fail("handled %q, which was never published", m.ID)
		w.mu.Unlock()
		return nil
	}
	lane := who + "/" + r.key
	if w.runs[lane] {
		w.fail("%s (key %s) ran while another message of its key was running on %q", m.ID, r.key, who)
	}
	if o, ok := w.done[m]; ok {
		w.fail("%s@%d attempt %d handled again after its delivery was %v", m.ID, m.Offset, m.Attempt, o)
	}
	w.runs[lane] = true
	w.calls[m.ID]++
	call := w.calls[m.ID]
	w.mu.Unlock()

	defer func() {
		v := recover()
		w.mu.Lock()
		w.runs[lane] = false
		if v != nil {
			err = fmt.Errorf("panicked: %v", v)
		}
		w.last[m] = err
		if err == nil {
			w.effects[r.key] = append(w.effects[r.key], m.ID)
		}
		w.mu.Unlock()
		if v != nil {
			panic(v)
		}
	}()
	switch r.class {
	case classFlaky:
		if call <= r.fails {
			err = errors.New("flaky dependency")
		}
	case classPoison:
		err = ackwise.Permanent(errors.New("poison"))
	case classHopeless:
		err = errors.New("never works")
	case classDiscard:
		err = ackwise.Discard(errors.New("not for us"))
	case classLater:
		if call <= r.fails {
			err = ackwise.RetryAfter(errors.New("rate limited"), r.after)
		}
	case classPanic:
		if call <= r.fails {
			panic("handler bug")
		}
	case classSlow:
		if call == 1 {
			time.Sleep(r.sleep)
		}
	}
	return err
}

func (w *stressWorld) Observe(m *ackwise.Message, o consumer.Outcome, _ time.Duration) {
	if o != consumer.Acked && o != consumer.DeadLettered && o != consumer.Discarded {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	err, ran := w.last[m]
	if o == consumer.Acked && (!ran || err != nil) {
		w.fail("%s@%d attempt %d acked, but its delivery's last run returned %v (ran: %t)", m.ID, m.Offset, m.Attempt, err, ran)
	}
	if o == consumer.Discarded && (!ran || ackwise.ClassOf(err) != ackwise.ClassDiscard) {
		w.fail("%s@%d attempt %d discarded, but its delivery's last run returned %v (ran: %t)", m.ID, m.Offset, m.Attempt, err, ran)
	}
	w.done[m] = o
}

func stressLog(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var (
		parts      = 1 + rng.IntN(3)
		keys       = 8 + rng.IntN(17)
		n          = 200 + rng.IntN(100)
		breaker    = rng.IntN(2) == 0
		reorder    = seed%3 == 0
		pace       = paces[rng.IntN(len(paces))]
		restarts   = 2 + rng.IntN(3)
		concurrent = 2 + rng.IntN(3)
	)
	cfg := consumer.Config{
		Ordering:     consumer.OrderKey,
		Concurrency:  concurrent,
		MaxInFlight:  concurrent * (2 + rng.IntN(8)),
		ReceiveBatch: 1 + rng.IntN(8),
		DrainTimeout: 10 * time.Second,
		Retry:        retry.Policy{MaxAttempts: 3 + rng.IntN(2), InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond},
	}
	if breaker {
		cfg.Breaker = &consumer.Breaker{Threshold: 2 + rng.IntN(3), ProbeInterval: time.Millisecond, MaxProbeInterval: 4 * time.Millisecond}
	}
	t.Logf("seed %d (replay: go test -race -run 'TestStressLog/seed=%d$' ./consumer/): %d partitions, %d keys, %d records, pace %s, concurrency %d, in flight %d, batch %d, max attempts %d, breaker %t, reorder %t, %d restarts",
		seed, seed, parts, keys, n, pace, cfg.Concurrency, cfg.MaxInFlight, cfg.ReceiveBatch, cfg.Retry.MaxAttempts, breaker, reorder, restarts)

	br, _ := memorytest.NewBroker(t)
	topic := memorytest.UniqueName(t)
	if err := br.CreateTopic(topic, memory.TopicConfig{Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	dlqName := topic + memory.DeadLetterSuffix
	if err := br.CreateQueue(dlqName, memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}

	w := newStressWorld()
	var pub []*ackwise.Message
	for i := range n {
		r := &stressRecord{id: "m" + strconv.Itoa(i), key: "k" + strconv.Itoa(rng.IntN(keys))}
		switch p := rng.IntN(100); {
		case p < 12:
			r.class, r.fails = classFlaky, 1+rng.IntN(2)
		case p < 17:
			r.class = classPoison
		case p < 20 && !breaker:
			// With the breaker, failures that never end would hold it
			// open for good: a dependency that never comes back.
			r.class = classHopeless
		}
		r.payload = []byte(fmt.Sprintf("payload-%d-%d", seed, i))
		w.recs[r.id] = r
		pub = append(pub, memorytest.Msg(r.id, r.key, string(r.payload)))
	}
	memorytest.Publish(t, br, topic, pub...)
	for _, e := range history(t, br, topic) {
		if e.Kind == memory.EventPublished {
			w.recs[e.ID].part, w.recs[e.ID].off = e.Partition, e.Offset
		}
	}

	// Faults fire on every Every-th matching call, Count times at most, on
	// the topic (so they outlive a member) and on the dead-letter queue.
	every := func(lo, hi int) int { return lo + rng.IntN(hi-lo+1) }
	faults := []*memory.InjectedFault{
		memorytest.Inject(t, br, topic, memory.Fault{Kind: memory.FaultLoseAck, Every: every(20, 60), Count: every(2, 6)}),
		memorytest.Inject(t, br, topic, memory.Fault{Kind: memory.FaultFailAck, Every: every(15, 40), Count: every(3, 8)}),
		memorytest.Inject(t, br, topic, memory.Fault{Kind: memory.FaultDuplicate, Every: every(7, 25), Count: every(5, 20)}),
		memorytest.Inject(t, br, topic, memory.Fault{Kind: memory.FaultCrashBeforeAck, Every: every(60, 200), Count: 1}),
		memorytest.Inject(t, br, topic, memory.Fault{Kind: memory.FaultCrashBeforeSettle, Every: every(100, 300), Count: 1}),
		memorytest.Inject(t, br, dlqName, memory.Fault{Kind: memory.FaultFailPublish, Every: every(2, 5), Count: every(1, 4)}),
	}
	if reorder {
		faults = append(faults, memorytest.Inject(t, br, topic, memory.Fault{Kind: memory.FaultReorder, Every: every(3, 10), Count: every(2, 8)}))
	}

	const group = "g"
	var (
		src  *memory.GroupSource
		c    *consumer.Consumer
		from int // history index the next phase's waits start at
	)
	join := func() {
		if src != nil {
			src.Close()
		}
		var err error
		if src, err = br.JoinGroup(topic, group); err != nil {
			t.Fatal(err)
		}
		if c, err = consumer.New(src, ackwise.HandlerFunc(w.Handle), withObserver(cfg, w)); err != nil {
			t.Fatal(err)
		}
		if pace != "adaptive" {
			consumer.PinPace(c, pace)
		}
	}
	t.Cleanup(func() {
		if src != nil {
			src.Close()
		}
	})
	committed := make([]int64, parts)
	// everSettled holds the records settled at least once so far (acked,
	// dead-lettered, or their ack lost): once it holds them all, a member
	// that keeps its partitions has nothing more to do (a lost ack on a log
	// comes back only when a member starts again from the committed offset).
	everSettled := map[string]bool{}
	runPhase := func(what string, until func(settled int, crashed, complete bool) bool) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		settled, crashed := 0, false
		me := src.ID()
		memorytest.WaitFor(t, br, topic, fmt.Sprintf("seed %d: %s", seed, what), func(evs []memory.Event) bool {
			for _, e := range evs[from:] {
				switch {
				case e.Kind == memory.EventAcked, e.Kind == memory.EventDeadLettered && e.Consumer != "",
					e.Kind == memory.EventFault && e.Fault == memory.FaultLoseAck:
					settled++
					everSettled[e.ID] = true
				case e.Kind == memory.EventCrashed && e.Consumer == me:
					crashed = true
				case e.Kind == memory.EventCommitted && e.Group == group:
					committed[e.Partition] = e.Offset
				}
			}
			from = len(evs)
			complete := true
			for p := range committed {
				complete = complete && committed[p] == int64(countIn(w.recs, int32(p)))
			}
			return until(settled, crashed, complete)
		})
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("seed %d: %s: Run = %v", seed, what, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("seed %d: %s: Run did not return after cancel: %+v", seed, what, c.Stats())
		}
		if st := c.Stats(); st.InFlight != 0 {
			t.Fatalf("seed %d: %s: %d in flight after the drain: %+v", seed, what, st.InFlight, st)
		}
	}

	join()
	crashedLast := false
	for i := range restarts {
		target := n/(2*restarts) + rng.IntN(n/restarts)
		if i > 0 && !crashedLast && rng.IntN(2) == 0 {
			// Run the same consumer on the same member again: it keeps
			// its partitions, and what the drain released comes back.
		} else if i > 0 {
			join()
		}
		runPhase(fmt.Sprintf("phase %d (%d settles)", i, target), func(settled int, crashed, complete bool) bool {
			crashedLast = crashed
			return settled >= target || crashed || complete || len(everSettled) == len(w.recs)
		})
	}
	fired := make([]int, len(faults))
	for i, x := range faults {
		fired[i] = x.Fired()
		x.Remove()
	}
	join()
	runPhase("the last run, faults removed, until every partition is committed", func(_ int, _, complete bool) bool { return complete })

	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("seed %d: faults fired %v (lose-ack, fail-ack, duplicate, crash-before-ack, crash-before-settle, dead-letter publish, reorder), %d handler calls, last run %+v", seed, fired, sumCalls(w.calls), c.Stats())
	for _, v := range w.bad {
		t.Errorf("seed %d: %s", seed, v)
	}
	checkStressFates(t, seed, br, topic, dlqName, w)
	if !reorder {
		checkStressOrder(t, seed, br, topic, w)
	}
}

func newStressWorld() *stressWorld {
	return &stressWorld{recs: map[string]*stressRecord{}, calls: map[string]int{}, runs: map[string]bool{},
		last: map[*ackwise.Message]error{}, done: map[*ackwise.Message]consumer.Outcome{}, effects: map[string][]string{}}
}

func withObserver(cfg consumer.Config, o consumer.Observer) consumer.Config {
	cfg.Observer = o
	return cfg
}

func sumCalls(calls map[string]int) int {
	k := 0
	for _, c := range calls {
		k += c
	}
	return k
}

func countIn(recs map[string]*stressRecord, part int32) int {
	k := 0
	for _, r := range recs {
		if r.part == part {
			k++
		}
	}
	return k
}

func history(t *testing.T, br *memory.Broker, dest string) []memory.Event {
	t.Helper()
	evs, err := br.History(dest)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// checkStressFates checks that every record ended as its class says: acked
// after a success, or dead-lettered with its payload intact.
// deadLetters returns the IDs of the dead letters in dlqName, checking
// that each is a published record's, payload byte for byte.
func (w *stressWorld) deadLetters(t *testing.T, seed uint64, br *memory.Broker, dlqName string) map[string]bool {
	t.Helper()
	letters, err := br.Messages(dlqName)
	if err != nil {
		t.Fatal(err)
	}
	inDLQ := map[string]bool{}
	for _, m := range letters {
		r := w.recs[m.ID]
		if r == nil || !bytes.Equal(m.Payload, r.payload) {
			t.Errorf("seed %d: dead letter %q with payload %q: not a published record's", seed, m.ID, m.Payload)
			continue
		}
		inDLQ[m.ID] = true
	}
	return inDLQ
}

// succeeded returns the IDs whose handler succeeded at least once.
func (w *stressWorld) succeeded() map[string]bool {
	out := map[string]bool{}
	for _, ids := range w.effects {
		for _, id := range ids {
			out[id] = true
		}
	}
	return out
}

func checkStressFates(t *testing.T, seed uint64, br *memory.Broker, topic, dlqName string, w *stressWorld) {
	acked, dead := map[string]bool{}, map[string]bool{}
	for _, e := range history(t, br, topic) {
		switch {
		case e.Kind == memory.EventAcked:
			acked[e.ID] = true
		case e.Kind == memory.EventDeadLettered && e.Consumer != "":
			dead[e.ID] = true
		}
	}
	inDLQ := w.deadLetters(t, seed, br, dlqName)
	succeeded := w.succeeded()
	for _, r := range w.recs {
		fate := fmt.Sprintf("%s (key %s, p%d@%d, class %d, %d calls): acked %t, dead-lettered %t (in the DLQ %t), succeeded %t",
			r.id, r.key, r.part, r.off, r.class, w.calls[r.id], acked[r.id], dead[r.id], inDLQ[r.id], succeeded[r.id])
		// The reverse may happen: a dead letter written for a delivery
		// that became invalid before its settle (move before ack).
		if dead[r.id] && !inDLQ[r.id] {
			t.Errorf("seed %d: %s: dead-lettered, but its dead letter is missing", seed, fate)
		}
		switch r.class {
		case classGood:
			if !acked[r.id] || !succeeded[r.id] || dead[r.id] {
				t.Errorf("seed %d: %s: want acked after a success, never dead-lettered", seed, fate)
			}
		case classFlaky:
			if !(acked[r.id] && succeeded[r.id]) && !dead[r.id] {
				t.Errorf("seed %d: %s: want acked after a success, or dead-lettered", seed, fate)
			}
		case classPoison, classHopeless:
			if acked[r.id] || succeeded[r.id] || !dead[r.id] {
				t.Errorf("seed %d: %s: want dead-lettered, never acked", seed, fate)
			}
		}
	}
}

// checkStressOrder checks, per key, that records were first settled in
// offset order, and that the first successful effects of the records never
// dead-lettered came in offset order. A lost ack counts as a settlement:
// the engine settled; the broker dropped it.
func checkStressOrder(t *testing.T, seed uint64, br *memory.Broker, topic string, w *stressWorld) {
	firstSettled := map[string][]string{}
	seen, dead := map[string]bool{}, map[string]bool{}
	for _, e := range history(t, br, topic) {
		switch {
		case e.Kind == memory.EventAcked, e.Kind == memory.EventDeadLettered && e.Consumer != "",
			e.Kind == memory.EventFault && e.Fault == memory.FaultLoseAck:
			if e.Kind == memory.EventDeadLettered {
				dead[e.ID] = true
			}
			if !seen[e.ID] {
				seen[e.ID] = true
				firstSettled[e.Key] = append(firstSettled[e.Key], e.ID)
			}
		}
	}
	offsets := func(ids []string) []int64 {
		out := make([]int64, len(ids))
		for i, id := range ids {
			out[i] = w.recs[id].off
		}
		return out
	}
	for key, ids := range firstSettled {
		if offs := offsets(ids); !slices.IsSorted(offs) {
			t.Errorf("seed %d: key %s: first settled at offsets %v (%v): not in offset order; history of the key:\n%s", seed, key, offs, ids, keyHistory(t, br, topic, key))
		}
	}
	for key, ids := range w.effects {
		var first []string
		once := map[string]bool{}
		for _, id := range ids {
			if !once[id] && !dead[id] {
				once[id] = true
				first = append(first, id)
			}
		}
		if offs := offsets(first); !slices.IsSorted(offs) {
			t.Errorf("seed %d: key %s: first successful effects at offsets %v (%v): not in offset order", seed, key, offs, first)
		}
	}
}

func keyHistory(t *testing.T, br *memory.Broker, topic, key string) string {
	var b strings.Builder
	for _, e := range history(t, br, topic) {
		if e.Key == key || e.Kind == memory.EventCrashed || e.Kind == memory.EventRebalanced {
			b.WriteString("  " + e.String() + "\n")
		}
	}
	return b.String()
}
