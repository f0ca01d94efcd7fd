package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// failingSettle fails one settle call, op ("ack", "nack" or "dead-letter"),
// of the message bad on its first delivery, as a broker whose connection
// dropped under the call would.
type failingSettle struct {
	*fakeSource
	op, bad string
}

func (s failingSettle) fails(op string, m *ackwise.Message) error {
	if op == s.op && m.ID == s.bad && m.Attempt == 1 {
		s.lose(m) // the delivery went with the connection
		return errors.New(op + ": connection reset by peer")
	}
	return nil
}

func (s failingSettle) Ack(ctx context.Context, m *ackwise.Message) error {
	if err := s.fails("ack", m); err != nil {
		return err
	}
	return s.fakeSource.Ack(ctx, m)
}

func (s failingSettle) Nack(ctx context.Context, m *ackwise.Message, d time.Duration) error {
	if err := s.fails("nack", m); err != nil {
		return err
	}
	return s.fakeSource.Nack(ctx, m, d)
}

func (s failingSettle) DeadLetter(ctx context.Context, m *ackwise.Message, env dlq.Envelope) error {
	if err := s.fails("dead-letter", m); err != nil {
		return err
	}
	return s.fakeSource.DeadLetter(ctx, m, env)
}

// failingSettleBatch acks in batches, failing as failingSettle does.
type failingSettleBatch struct{ failingSettle }

func (s failingSettleBatch) Extensions() adapters.Extensions {
	return adapters.Extensions{BatchAcker: s}
}

func (s failingSettleBatch) AckBatch(ctx context.Context, msgs []*ackwise.Message, errs []error) {
	for i, m := range msgs {
		errs[i] = s.Ack(ctx, m)
	}
}

// When the settle of an ordered message fails, the engine releases it (the
// broker redelivers it); the message queued behind it in its lane must not
// run before that redelivery, or it would overtake it: it is released too.
// For a failed Ack (one at a time and in a batch), Nack and DeadLetter, per
// key and per partition, in each pace.
func TestFailedSettleReleasesLane(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"ack", "batch-ack", "nack", "dead-letter"} {
		for _, ordering := range []consumer.Ordering{consumer.OrderKey, consumer.OrderPartition} {
			for _, pace := range paces {
				t.Run(fmt.Sprintf("%s/%v/%s", op, ordering, pace), func(t *testing.T) {
					failedSettleReleasesLane(t, op, ordering, pace)
				})
			}
		}
	}
}

func failedSettleReleasesLane(t *testing.T, op string, ordering consumer.Ordering, pace string) {
	// Two messages of one lane: of one key, or of two keys on one
	// partition.
	keys := 1
	if ordering == consumer.OrderPartition {
		keys = 2
	}
	in := msgs(2, keys)
	fs := newFakeSource(adapters.Capabilities{Delay: true}, in...)
	fail := failingSettle{fs, op, in[0].ID}
	var src adapters.Source = fail
	if op == "batch-ack" {
		fail.op = "ack"
		src = failingSettleBatch{fail}
	}
	var mu sync.Mutex
	var handled []string
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		mu.Lock()
		handled = append(handled, fmt.Sprintf("%s#%d", m.ID, m.Attempt))
		mu.Unlock()
		if m.ID == in[0].ID && m.Attempt == 1 {
			switch op {
			case "nack":
				return errDown
			case "dead-letter":
				return ackwise.Permanent(errDown)
			}
		}
		return nil
	})
	c := newPaced(t, src, h, consumer.Config{Ordering: ordering, RetryMode: consumer.RetryBroker}, pace)
	run(t, c)

	// e0's settle fails: it is released, and so is e1, unhandled.
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool {
		return s.SettleFailed == 1 && s.Released+s.Acked == 1 && s.InFlight == 0
	}) {
		t.Fatalf("stats %+v", c.Stats())
	}
	mu.Lock()
	got := slices.Clone(handled)
	mu.Unlock()
	if want := []string{"e0#1"}; !slices.Equal(got, want) {
		t.Fatalf("handled %v before e0 came back, want %v: e1 overtook e0", got, want)
	}
	fs.mu.Lock()
	var released []string
	for _, m := range fs.released {
		released = append(released, m.ID)
	}
	fs.mu.Unlock()
	if want := []string{"e0", "e1"}; !slices.Equal(released, want) {
		t.Fatalf("released %v, want %v", released, want)
	}

	// The broker redelivers both, in order: they run in order.
	var again []*ackwise.Message
	for _, m := range in {
		r := *m
		r.Attempt = 2
		again = append(again, &r)
	}
	fs.push(again...)
	if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.Acked == 2 && s.InFlight == 0 }) {
		t.Fatalf("stats after redelivery %+v", c.Stats())
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"e0#1", "e0#2", "e1#2"}; !slices.Equal(handled, want) {
		t.Fatalf("handled %v, want %v", handled, want)
	}
}

// End to end on the memory log (ordered, like a Kafka partition): the ack,
// or the dead letter, of a key's first message fails once. A failed ack
// hands it back and the broker redelivers it: the messages queued behind it
// are released with it, and the log redelivers them after it. A failed dead
// letter is tried again in place, the key held meanwhile. Either way the
// effects of the key's messages happen in publish order.
func TestFailedSettleKeepsKeyOrderMemory(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"ack", "dead-letter"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			br, topic := logWithDLQ(t)
			const n = 10
			var pub []*ackwise.Message
			for i := range n {
				for _, key := range []string{"a", "b"} {
					pub = append(pub, memorytest.Msg(fmt.Sprintf("%s-%d", key, i), key, fmt.Sprint(i)))
				}
			}
			var fault *memory.InjectedFault
			switch op {
			case "ack":
				fault = memorytest.Inject(t, br, topic, memory.Fault{Kind: memory.FaultFailAck, Count: 1, Match: func(m *ackwise.Message) bool { return m.ID == "a-0" }})
			case "dead-letter":
				fault = memorytest.Inject(t, br, topic+memory.DeadLetterSuffix, memory.Fault{Kind: memory.FaultFailPublish, Count: 1})
			}
			// Published before the consumer starts: a-1… are received with
			// a-0 and wait behind it in its lane.
			memorytest.Publish(t, br, topic, pub...)
			src, err := br.JoinGroup(topic, "g")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { src.Close() })

			var mu sync.Mutex
			effects := map[string][]int{}
			h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
				i, _ := strconv.Atoi(string(m.Payload))
				mu.Lock()
				effects[m.Key] = append(effects[m.Key], i)
				mu.Unlock()
				if op == "dead-letter" && m.ID == "a-0" && m.Attempt == 1 {
					return ackwise.Permanent(errors.New("invalid order"))
				}
				return nil
			})
			c, err := consumer.New(src, h, consumer.Config{})
			if err != nil {
				t.Fatal(err)
			}
			run(t, c)
			// A failed ack hands a-0 back and it runs again; a failed dead
			// letter is tried again in place, a-0 run once.
			acked, dead, runs := 2*n, 0, n+1
			if op == "dead-letter" {
				acked, dead, runs = 2*n-1, 1, n
			}
			if !waitStats(c, 10*time.Second, func(s consumer.Stats) bool {
				return s.Acked == uint64(acked) && s.DeadLettered == uint64(dead) && s.InFlight == 0
			}) {
				t.Fatalf("stats %+v", c.Stats())
			}
			if got := fault.Fired(); got != 1 {
				t.Fatalf("fault fired %d times, want 1", got)
			}
			if st := c.Stats(); st.SettleFailed != 1 {
				t.Fatalf("settle failed %d, want 1", st.SettleFailed)
			}
			mu.Lock()
			defer mu.Unlock()
			for key, seq := range effects {
				// a-0 never runs after a later message of its key.
				if !slices.IsSorted(seq) {
					t.Errorf("key %s: effects in order %v", key, seq)
				}
			}
			if len(effects["a"]) != runs {
				t.Errorf("key a: %d effects, want %d", len(effects["a"]), runs)
			}
			memorytest.RequireHandledInOrder(t, br, topic, "a")
		})
	}
}

// TestFailingDeadLetterTriedAgainInPlace: a message whose dead letter
// cannot be written (the dead-letter queue refuses every publish) stays in
// flight, its handler run once, and its dead letter is tried again in
// place, after 10ms doubling: not in a loop as fast as the calls fail, and
// not handed back to the broker (which would run the handler again and, on
// a broker counting deliveries, spend them). The engine runs on the
// broker's virtual clock: half a second of it holds the tries at 10, 30,
// 70, 150 and 310ms after the first, whatever the machine's load.
func TestFailingDeadLetterTriedAgainInPlace(t *testing.T) {
	t.Parallel()
	br, clk, topic := logWithDLQClock(t)
	fault := memorytest.Inject(t, br, topic+memory.DeadLetterSuffix, memory.Fault{Kind: memory.FaultFailPublish}) // every time
	memorytest.Publish(t, br, topic, memorytest.Msg("poison", "k", "x"))
	src, err := br.JoinGroup(topic, "g")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	var runs atomic.Int64
	c, err := consumer.New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		runs.Add(1)
		return ackwise.Permanent(errors.New("invalid order"))
	}), consumer.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	// Over half a second, pauses of 10, 20, 40, 80, 160ms... leave room
	// for a handful of tries; without them there are thousands.
	advanceInPlaceWaits(t, clk, 500*time.Millisecond)
	if n := fault.Fired(); n < 2 || n > 12 {
		t.Fatalf("%d tries of a dead letter that always fails, within 500ms: want a few, paced", n)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times: want once, its dead letter tried again in place", n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Stopped while it waited: handed back, never settled.
	memorytest.RequireNotAcked(t, br, topic, "poison")
	if st := c.Stats(); st.Released != 0 || st.DeadLettered != 0 || st.SettleFailed != uint64(fault.Fired()) {
		t.Fatalf("stats %+v, %d failed tries: want every try observed as SettleFailed, and only that", st, fault.Fired())
	}
}

// advanceInPlaceWaits moves clk on by d, in steps of 5ms, with one in-place
// wait of the engine's armed at each step: a step that ends a wait (its try
// runs in a goroutine of its own) waits until the engine arms the next, so
// every try due within d is made, on time, however slowly the machine runs
// them. It fails t if no wait is armed within a minute: the message was
// handed back or settled instead.
func advanceInPlaceWaits(t *testing.T, clk *memory.VirtualClock, d time.Duration) {
	t.Helper()
	const step = 5 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for passed := time.Duration(0); passed < d; passed += step {
		if err := clk.WaitForTimers(ctx, 1); err != nil {
			t.Fatalf("no in-place wait armed after %v of virtual time", passed)
		}
		clk.Advance(step)
	}
}

// logWithDLQ starts a memory broker with a topic and its dead-letter queue.
func logWithDLQ(t *testing.T) (*memory.Broker, string) {
	t.Helper()
	br, _, topic := logWithDLQClock(t)
	return br, topic
}

// logWithDLQClock is logWithDLQ, with the broker's virtual clock.
func logWithDLQClock(t *testing.T) (*memory.Broker, *memory.VirtualClock, string) {
	t.Helper()
	br, clk := memorytest.NewBroker(t)
	topic := memorytest.UniqueName(t)
	if err := br.CreateTopic(topic, memory.TopicConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := br.CreateQueue(topic+memory.DeadLetterSuffix, memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	return br, clk, topic
}

// A message whose dead letter always fails, among healthy messages of other
// keys that settle fine: its dead letter is tried again in place, 10ms
// doubling up to 5s, so a few times, not as fast as the calls fail, its
// handler run once, and the healthy messages, received meanwhile, are not
// held back by its waits. Stop releases it from its wait. The engine runs
// on the broker's virtual clock: the healthy messages are all handled while
// it stands still (a healthy message held back until the poison's next try
// would never be), and a second of it holds a handful of tries, whatever
// the machine's load.
func TestFailingSettleDelaysOnlyItsMessage(t *testing.T) {
	t.Parallel()
	br, clk, topic := logWithDLQClock(t) // one partition: the poison's and the healthy ones'
	// Only the poison fails, so only its dead letter is attempted.
	fault := memorytest.Inject(t, br, topic+memory.DeadLetterSuffix, memory.Fault{Kind: memory.FaultFailPublish})
	memorytest.Publish(t, br, topic, memorytest.Msg("poison", "p", "x"))
	src, err := br.JoinGroup(topic, "g")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	var (
		poisonRuns atomic.Int64
		mu         sync.Mutex
		handled    = map[string]bool{}
	)
	c, err := consumer.New(src, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == "poison" {
			poisonRuns.Add(1)
			return ackwise.Permanent(errors.New("invalid order"))
		}
		mu.Lock()
		handled[m.ID] = true
		mu.Unlock()
		return nil
	}), consumer.Config{Clock: clk, Concurrency: 1}) // one worker: the poison's wait must not hold it
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := clk.WaitForTimers(ctx, 1); err != nil { // the poison's first try failed: it waits
		t.Fatal("the poison's dead letter never waited in place")
	}
	// Healthy messages arrive while it waits; the clock stands still.
	const healthy = 50
	for i := range healthy {
		id := "h" + strconv.Itoa(i)
		memorytest.Publish(t, br, topic, memorytest.Msg(id, "k"+strconv.Itoa(i%10), "x"))
	}
	memorytest.WaitForAckCount(t, br, topic, healthy)
	mu.Lock()
	if len(handled) != healthy {
		t.Errorf("%d of %d healthy messages handled", len(handled), healthy)
	}
	mu.Unlock()
	if n := fault.Fired(); n != 1 {
		t.Fatalf("%d tries of the poison's dead letter before its wait ended, want 1", n)
	}
	// Over a second, waits of 10, 20, 40... 320, 640ms leave room for a
	// handful of tries; without them there are hundreds.
	advanceInPlaceWaits(t, clk, time.Second)
	t.Logf("%d tries within a second", fault.Fired())
	if n := fault.Fired(); n < 2 || n > 15 {
		t.Errorf("%d tries of a dead letter that always fails, within a second: want a few, paced", n)
	}
	if n := poisonRuns.Load(); n != 1 {
		t.Errorf("the poison ran %d times: want once, its dead letter tried again in place", n)
	}
	// Stop releases the poison's wait: a Run waiting for its next try
	// (the clock stands still) would not return (stop fails the test).
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}
