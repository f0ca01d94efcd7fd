package kafka

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// outcomeLog is a consumer.Observer that sends each outcome on a channel.
type outcomeLog chan consumer.Outcome

func (o outcomeLog) Observe(_ *ackwise.Message, out consumer.Outcome, _ time.Duration) { o <- out }

// runShareConsumer runs a consumer of src with h and cfg until the returned
// stop is called; stop returns Run's error.
func runShareConsumer(t *testing.T, src *ShareSource, h ackwise.Handler, cfg consumer.Config) (stop func() error) {
	t.Helper()
	cons, err := consumer.New(src, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// awaitOutcome waits for the next outcome, failing the test after 15s.
func awaitOutcome(t *testing.T, log outcomeLog) consumer.Outcome {
	t.Helper()
	select {
	case o := <-log:
		return o
	case <-time.After(15 * time.Second):
		t.Fatal("no outcome within 15s")
		return 0
	}
}

// TestShareTransientRetriesWaitThenDeadLetter: a record whose handler keeps
// failing transiently is retried in place (a share source has no Delay) at
// the next attempt after the policy's backoff, not at full speed, then dead-
// lettered with reason max-attempts, and accepted only after: no member of
// the group gets it again.
func TestShareTransientRetriesWaitThenDeadLetter(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	in := publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })[0]
	src := openShare(t, cfg)
	const backoff = 150 * time.Millisecond
	var mu sync.Mutex
	var attempts []int
	var at []time.Time
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, m.Attempt)
		at = append(at, time.Now())
		return errors.New("dependency down")
	})
	log := make(outcomeLog, 16)
	stop := runShareConsumer(t, src, h, consumer.Config{
		Concurrency: 1, MaxInFlight: 1, Observer: log,
		Retry: retry.Policy{MaxAttempts: 3, InitialInterval: backoff, Multiplier: 1, Jitter: retry.NoJitter},
	})
	for _, want := range []consumer.Outcome{consumer.Retried, consumer.Retried, consumer.DeadLettered} {
		if o := awaitOutcome(t, log); o != want {
			t.Fatalf("outcome %v, want %v", o, want)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != 3 || attempts[0] != 1 || attempts[1] != 2 || attempts[2] != 3 {
		t.Fatalf("handler saw attempts %v, want [1 2 3]", attempts)
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < backoff {
			t.Errorf("attempt %d ran %v after the one before, want at least the %v backoff", attempts[i], gap, backoff)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dls := readAll(ctx, t, brokers, src.cfg.DeadLetterTopic)
	if len(dls) != 1 || recordMessage(dls[0]).ID != in.ID {
		t.Fatalf("dead letters %v", dls)
	}
	if h := recordMessage(dls[0]).Headers; h.Get(dlq.HeaderReason) != string(dlq.ReasonMaxAttempts) || h.Get(dlq.HeaderAttempts) != "3" {
		t.Fatalf("dead letter headers %v", h)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	// Accepted: another member of the group gets nothing.
	src2 := openShare(t, cfg)
	wait, cancelWait := context.WithTimeout(ctx, time.Second)
	defer cancelWait()
	if n, _ := src2.Receive(wait, make([]*ackwise.Message, 1)); n > 0 {
		t.Fatal("the dead-lettered record was delivered again")
	}
}

// TestShareShutdownReleasesRetryingRecords: records waiting in place for a
// retry when the consumer stops are handed back, not accepted: the next
// member gets each of them again, at the next delivery count.
func TestShareShutdownReleasesRetryingRecords(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	in := publishN(t, openSink(t, cfg), 3, func(i int) string { return "k" + string(rune('a'+i)) })
	src := openShare(t, cfg)
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		return ackwise.RetryAfter(errors.New("slow down"), time.Minute)
	})
	log := make(outcomeLog, 16)
	// A drain that waited for the retries (a minute away) would end at
	// DrainTimeout, and Run would return ErrDrainTimeout: no wall-clock
	// bound of the test's own, which a busy machine could overrun.
	stop := runShareConsumer(t, src, h, consumer.Config{Concurrency: 3, MaxInFlight: 3, Observer: log, DrainTimeout: 20 * time.Second})
	for range in {
		if o := awaitOutcome(t, log); o != consumer.Retried {
			t.Fatalf("outcome %v, want retried", o)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run = %v: the drain waited for the records' retries", err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	again := receiveN(t, openShare(t, cfg), len(in))
	seen := map[string]int{}
	for _, m := range again {
		seen[m.ID] = m.Attempt
	}
	for _, m := range in {
		if a, ok := seen[m.ID]; !ok || a != 2 {
			t.Errorf("%s after shutdown: delivered %v at attempt %d, want again at 2", m.ID, ok, a)
		}
	}
}

// TestShareTwoMembersWithFailures: two members of one group, handlers
// failing transiently at random: every record is acked, none is handled by
// both members at once.
func TestShareTwoMembersWithFailures(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 2)
	cfg.PollBatch = 4
	const n = 40
	in := publishN(t, openSink(t, cfg), n, func(i int) string { return "k" + string(rune('a'+i%7)) })
	var mu sync.Mutex
	running := map[string]bool{}
	acked := map[string]bool{}
	all := make(chan struct{})
	var overlap []string
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		mu.Lock()
		if running[m.ID] {
			overlap = append(overlap, m.ID)
		}
		running[m.ID] = true
		mu.Unlock()
		time.Sleep(time.Millisecond) // some work, so that handlers overlap
		mu.Lock()
		defer mu.Unlock()
		delete(running, m.ID)
		if m.Attempt < 2 && m.Payload[len(m.Payload)-1]%2 == 0 {
			return errors.New("flaky")
		}
		acked[m.ID] = true
		if len(acked) == n {
			close(all)
		}
		return nil
	})
	pol := retry.Policy{MaxAttempts: 5, InitialInterval: 20 * time.Millisecond, Jitter: retry.NoJitter}
	for range 2 {
		runShareConsumer(t, openShare(t, cfg), h, consumer.Config{Concurrency: 4, MaxInFlight: 4, Retry: pol})
	}
	select {
	case <-all:
	case <-time.After(20 * time.Second):
		mu.Lock()
		t.Fatalf("%d of %d records acked", len(acked), n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(overlap) > 0 {
		t.Fatalf("handled by both members at once: %v", overlap)
	}
	for _, m := range in {
		if !acked[m.ID] {
			t.Errorf("%s not acked", m.ID)
		}
	}
}
