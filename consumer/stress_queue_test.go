package consumer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// queueStressSeeds is how many seeds TestStressQueue runs (a quarter of
// them with -short); each is a subtest named seed=N, so one is replayed with
// -run 'TestStressQueue/seed=N$'.
const queueStressSeeds = 100

// shortScaled is n, or a quarter of it with -short (the offline unit run,
// bound to finish in minutes): the seeded stress tests run in full in
// `make test`.
func shortScaled(n uint64) uint64 {
	if testing.Short() {
		return max(n/4, 1)
	}
	return n
}

// TestStressQueue runs competing consumers, ordered by key, on one memory
// queue (standard or FIFO) under seeded random conditions: handler
// outcomes of every class (success, transient, permanent, discard,
// RetryAfter, panics, a first run slower than the lease), retries in place
// or through the broker, a broker-side MaxReceives, injected faults (lost,
// failed and crashing acks and settles, duplicates, reordered batches,
// failing dead letters, tried again in place), the breaker, leases that
// run out (consumers that cannot extend them) or are extended by the
// heartbeat, and stops and restarts midway (the same consumer run again,
// or a new one on a new source). The faults are then removed and a last
// run goes on until every message is settled at the broker. The broker's
// clock is the system clock: leases run out in real time. It checks, none
// of it depending on timing:
//   - nothing is lost: every message is settled at the broker exactly once
//     (acked or dead-lettered), as its class says, and is gone from the
//     queue; a dead-lettered one is in the dead-letter queue, byte-identical;
//   - an ack follows a success (a discard, a Discard) of the same delivery,
//     and no delivery is handled after it was settled (a message runs
//     again only through another delivery: a duplicate, a redelivery after
//     its lease ran out, a settle failed or lost);
//   - within one consumer, a key's messages run one at a time;
//   - on a FIFO queue, each key's messages are settled in publish order,
//     and the first successful effects of those neither dead-lettered nor
//     discarded come in publish order too (a run whose lease ran out may
//     still end later, but its effect is then not the message's first);
//   - every run ends, and drains cleanly.
func TestStressQueue(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= shortScaled(queueStressSeeds); seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			stressQueue(t, seed)
		})
	}
}

// leaseBlind is a queue source whose consumer cannot extend leases (as a
// broker without a lease extension): a run longer than the lease loses its
// message to another delivery.
type leaseBlind struct{ *memory.QueueSource }

func (s leaseBlind) Capabilities() adapters.Capabilities {
	caps := s.QueueSource.Capabilities()
	caps.ExtendLease = false
	return caps
}

// queueMember is one competing consumer and its source.
type queueMember struct {
	src *memory.QueueSource
	c   *consumer.Consumer
}

func stressQueue(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x9e0e))
	leases := []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond}
	var (
		fifo        = rng.IntN(2) == 0
		lease       = leases[rng.IntN(len(leases))]
		maxReceives = 0
		keys        = 6 + rng.IntN(15)
		n           = 120 + rng.IntN(80)
		breaker     = rng.IntN(3) == 0
		blind       = rng.IntN(3) // thirds of the consumers that cannot extend leases
		members     = 1 + rng.IntN(3)
		restarts    = 2 + rng.IntN(3)
		concurrent  = 1 + rng.IntN(3)
		retryPanics = rng.IntN(2) == 0
		mode        = []consumer.RetryMode{consumer.RetryAuto, consumer.RetryInPlace, consumer.RetryBroker}[rng.IntN(3)]
	)
	if rng.IntN(2) == 0 {
		maxReceives = 6 + rng.IntN(4)
	}
	cfg := consumer.Config{
		Ordering:     consumer.OrderKey,
		Concurrency:  concurrent,
		MaxInFlight:  concurrent * (2 + rng.IntN(6)),
		ReceiveBatch: 1 + rng.IntN(6),
		DrainTimeout: 10 * time.Second,
		RetryMode:    mode,
		RetryPanics:  retryPanics,
		Retry:        retry.Policy{MaxAttempts: 3 + rng.IntN(2), InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond},
	}
	if breaker {
		cfg.Breaker = &consumer.Breaker{Threshold: 2 + rng.IntN(3), ProbeInterval: time.Millisecond, MaxProbeInterval: 4 * time.Millisecond}
	}
	t.Logf("seed %d (replay: go test -race -run 'TestStressQueue/seed=%d$' ./consumer/): fifo %t, lease %v, max receives %d, %d keys, %d messages, %d consumers (%d/3 lease-blind), concurrency %d, in flight %d, batch %d, retry %v, max attempts %d, retry panics %t, breaker %t, %d restarts",
		seed, seed, fifo, lease, maxReceives, keys, n, members, blind, cfg.Concurrency, cfg.MaxInFlight, cfg.ReceiveBatch, mode, cfg.Retry.MaxAttempts, retryPanics, breaker, restarts)

	br, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	queue := memorytest.UniqueName(t)
	dlqName := queue + memory.DeadLetterSuffix
	if err := br.CreateQueue(dlqName, memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := br.CreateQueue(queue, memory.QueueConfig{Lease: lease, MaxReceives: maxReceives, FIFO: fifo}); err != nil {
		t.Fatal(err)
	}

	w := newStressWorld()
	var pub []*ackwise.Message
	order := map[string]int{} // publish order by event ID
	for i := range n {
		r := &stressRecord{id: "m" + strconv.Itoa(i), key: "k" + strconv.Itoa(rng.IntN(keys))}
		switch p := rng.IntN(100); {
		case p < 10:
			r.class, r.fails = classFlaky, 1+rng.IntN(2)
		case p < 14:
			r.class = classPoison
		case p < 18:
			r.class = classDiscard
		case p < 24:
			r.class, r.fails, r.after = classLater, 1+rng.IntN(2), time.Duration(1+rng.IntN(3))*time.Millisecond
		case p < 27:
			r.class, r.fails = classPanic, 1
			if !retryPanics {
				r.fails = 1 << 30
			}
		case p < 33:
			r.class, r.sleep = classSlow, lease+time.Duration(1+rng.IntN(5))*time.Millisecond
		case p < 36 && !breaker:
			// With the breaker, failures that never end would hold it
			// open for good: a dependency that never comes back.
			r.class = classHopeless
		}
		r.payload = fmt.Appendf(nil, "payload-%d-%d", seed, i)
		w.recs[r.id] = r
		order[r.id] = i
		pub = append(pub, memorytest.Msg(r.id, r.key, string(r.payload)))
	}
	memorytest.Publish(t, br, queue, pub...)

	every := func(lo, hi int) int { return lo + rng.IntN(hi-lo+1) }
	faults := []*memory.InjectedFault{
		memorytest.Inject(t, br, queue, memory.Fault{Kind: memory.FaultLoseAck, Every: every(20, 60), Count: every(2, 6)}),
		memorytest.Inject(t, br, queue, memory.Fault{Kind: memory.FaultFailAck, Every: every(15, 40), Count: every(3, 8)}),
		memorytest.Inject(t, br, queue, memory.Fault{Kind: memory.FaultDuplicate, Every: every(7, 25), Count: every(5, 20)}),
		memorytest.Inject(t, br, queue, memory.Fault{Kind: memory.FaultReorder, Every: every(3, 10), Count: every(2, 8)}),
		memorytest.Inject(t, br, queue, memory.Fault{Kind: memory.FaultCrashBeforeAck, Every: every(60, 200), Count: 1}),
		memorytest.Inject(t, br, queue, memory.Fault{Kind: memory.FaultCrashBeforeSettle, Every: every(40, 150), Count: 1}),
		memorytest.Inject(t, br, dlqName, memory.Fault{Kind: memory.FaultFailPublish, Every: every(2, 5), Count: every(1, 4)}),
		memorytest.Inject(t, br, dlqName, memory.Fault{Kind: memory.FaultFailPublish, Every: every(3, 6), Count: every(1, 2), AfterStore: true}),
	}

	group := make([]*queueMember, members)
	open := func(i int, canBlind bool) {
		if m := group[i]; m != nil {
			m.src.Close()
		}
		src, err := br.QueueSource(queue)
		if err != nil {
			t.Fatal(err)
		}
		var s adapters.Source = src
		if canBlind && rng.IntN(3) < blind {
			s = leaseBlind{src}
		}
		c, err := consumer.New(s, w.handler(src.ID()), withObserver(cfg, w))
		if err != nil {
			t.Fatal(err)
		}
		group[i] = &queueMember{src: src, c: c}
	}
	t.Cleanup(func() {
		for _, m := range group {
			if m != nil {
				m.src.Close()
			}
		}
	})

	from := 0 // history index the next phase's waits start at
	settledAll := map[string]bool{}
	runPhase := func(what string, until func(settled int, crashed, complete bool) bool) (crashed map[string]bool) {
		ctx, cancel := context.WithCancel(context.Background())
		dones := make([]chan error, len(group))
		for i, m := range group {
			dones[i] = make(chan error, 1)
			go func() { dones[i] <- m.c.Run(ctx) }()
		}
		settled := 0
		crashed = map[string]bool{}
		memorytest.WaitFor(t, br, queue, fmt.Sprintf("seed %d: %s", seed, what), func(evs []memory.Event) bool {
			for _, e := range evs[from:] {
				switch e.Kind {
				case memory.EventAcked, memory.EventDeadLettered:
					settled++
					settledAll[e.ID] = true
				case memory.EventCrashed:
					crashed[e.Consumer] = true
				}
			}
			from = len(evs)
			return until(settled, len(crashed) > 0, len(settledAll) == n)
		})
		cancel()
		for i, m := range group {
			select {
			case err := <-dones[i]:
				if err != nil {
					t.Fatalf("seed %d: %s: %s: Run = %v", seed, what, m.src.ID(), err)
				}
			case <-time.After(15 * time.Second):
				t.Fatalf("seed %d: %s: %s: Run did not return after cancel: %+v", seed, what, m.src.ID(), m.c.Stats())
			}
			if st := m.c.Stats(); st.InFlight != 0 {
				t.Fatalf("seed %d: %s: %s: %d in flight after the drain: %+v", seed, what, m.src.ID(), st.InFlight, st)
			}
		}
		return crashed
	}

	for i := range members {
		open(i, true)
	}
	for i := range restarts {
		target := n/(2*restarts) + rng.IntN(n/restarts)
		crashed := runPhase(fmt.Sprintf("phase %d (%d settles)", i, target), func(settled int, crashed, complete bool) bool {
			return settled >= target || crashed || complete
		})
		for j, m := range group {
			// A crashed source stays crashed: its consumer is replaced.
			// Another is run again as it is (what its drain released comes
			// back to any of them), or replaced too.
			if crashed[m.src.ID()] || rng.IntN(2) == 0 {
				open(j, true)
			}
		}
	}
	fired := make([]int, len(faults))
	for i, x := range faults {
		fired[i] = x.Fired()
		x.Remove()
	}
	for i := range members {
		open(i, false)
	}
	runPhase("the last run, faults removed, until every message is settled", func(_ int, _, complete bool) bool { return complete })

	expired, redriven := 0, 0
	for _, e := range history(t, br, queue) {
		switch {
		case e.Kind == memory.EventExpired:
			expired++
		case e.Kind == memory.EventDeadLettered && e.Consumer == "":
			redriven++
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("seed %d: faults fired %v (lose-ack, fail-ack, duplicate, reorder, crash-before-ack, crash-before-settle, dead-letter publish, its confirmation), %d handler calls, %d leases ran out, %d dead-lettered by the broker", seed, fired, sumCalls(w.calls), expired, redriven)
	for _, v := range w.bad {
		t.Errorf("seed %d: %s", seed, v)
	}
	checkQueueFates(t, seed, br, queue, dlqName, maxReceives > 0, retryPanics, w)
	if fifo {
		checkQueueOrder(t, seed, br, queue, order, w)
	}
}

// checkQueueFates checks that every message was settled at the broker
// exactly once, as its class says, and that its dead letters are intact.
func checkQueueFates(t *testing.T, seed uint64, br *memory.Broker, queue, dlqName string, maxReceives, retryPanics bool, w *stressWorld) {
	settles := map[string]int{}
	acked, dead, redriven := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, e := range history(t, br, queue) {
		switch e.Kind {
		case memory.EventAcked:
			settles[e.ID]++
			acked[e.ID] = true
		case memory.EventDeadLettered:
			settles[e.ID]++
			dead[e.ID] = true
			redriven[e.ID] = e.Consumer == ""
		}
	}
	st, err := br.Stats(queue)
	if err != nil {
		t.Fatal(err)
	}
	if st.Ready != 0 || st.Delayed != 0 || st.InFlight != 0 {
		t.Errorf("seed %d: the queue still holds messages: %+v", seed, st)
	}
	inDLQ := w.deadLetters(t, seed, br, dlqName)
	succeeded := w.succeeded()
	for _, r := range w.recs {
		fate := fmt.Sprintf("%s (key %s, class %d, %d calls): settled %d times, acked %t, dead-lettered %t (by the broker %t, in the DLQ %t), succeeded %t",
			r.id, r.key, r.class, w.calls[r.id], settles[r.id], acked[r.id], dead[r.id], redriven[r.id], inDLQ[r.id], succeeded[r.id])
		if settles[r.id] != 1 {
			t.Errorf("seed %d: %s: want settled at the broker exactly once", seed, fate)
		}
		// The reverse may happen: a dead letter written for a delivery
		// whose lease ran out before the delete (move before ack).
		if dead[r.id] && !inDLQ[r.id] {
			t.Errorf("seed %d: %s: dead-lettered, but its dead letter is missing", seed, fate)
		}
		if redriven[r.id] {
			// Any message may use up MaxReceives: lost and failed acks,
			// crashes and leases that ran out all count receives.
			if !maxReceives {
				t.Errorf("seed %d: %s: dead-lettered by the broker without MaxReceives", seed, fate)
			}
			continue
		}
		switch r.class {
		case classGood, classSlow:
			if !acked[r.id] || !succeeded[r.id] {
				t.Errorf("seed %d: %s: want acked after a success", seed, fate)
			}
		case classDiscard:
			if !acked[r.id] || succeeded[r.id] {
				t.Errorf("seed %d: %s: want discarded (acked without a success)", seed, fate)
			}
		case classFlaky, classLater:
			if !(acked[r.id] && succeeded[r.id]) && !dead[r.id] {
				t.Errorf("seed %d: %s: want acked after a success, or dead-lettered", seed, fate)
			}
		case classPanic:
			if retryPanics {
				if !(acked[r.id] && succeeded[r.id]) && !dead[r.id] {
					t.Errorf("seed %d: %s: want acked after a success, or dead-lettered", seed, fate)
				}
			} else if acked[r.id] || succeeded[r.id] || !dead[r.id] {
				t.Errorf("seed %d: %s: want dead-lettered, never acked", seed, fate)
			}
		case classPoison, classHopeless:
			if acked[r.id] || succeeded[r.id] || !dead[r.id] {
				t.Errorf("seed %d: %s: want dead-lettered, never acked", seed, fate)
			}
		}
	}
}

// checkQueueOrder checks, per key of a FIFO queue, that messages were
// settled in publish order, and that the first successful effects of those
// neither dead-lettered nor discarded came in publish order.
func checkQueueOrder(t *testing.T, seed uint64, br *memory.Broker, queue string, order map[string]int, w *stressWorld) {
	settled := map[string][]int{}
	dead := map[string]bool{}
	for _, e := range history(t, br, queue) {
		switch e.Kind {
		case memory.EventAcked, memory.EventDeadLettered:
			dead[e.ID] = e.Kind == memory.EventDeadLettered
			settled[e.Key] = append(settled[e.Key], order[e.ID])
		}
	}
	for key, seq := range settled {
		if !slices.IsSorted(seq) {
			t.Errorf("seed %d: key %s: settled in publish order %v", seed, key, seq)
		}
	}
	for key, ids := range w.effects {
		var first []int
		once := map[string]bool{}
		for _, id := range ids {
			if !once[id] && !dead[id] && w.recs[id].class != classDiscard {
				once[id] = true
				first = append(first, order[id])
			}
		}
		if !slices.IsSorted(first) {
			t.Errorf("seed %d: key %s: first successful effects in publish order %v", seed, key, first)
		}
	}
}
