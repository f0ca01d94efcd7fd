package adaptertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
)

// DefaultTimeout is the Harness.Timeout used when it is zero.
const DefaultTimeout = 20 * time.Second

// Run runs the conformance suite against the adapter behind h. Every case
// opens its own destination. A case a broker cannot support by design (as
// its source's Capabilities and Extensions say, or a Fixture hook left nil)
// calls t.Skip saying what it did not check and why.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Open == nil {
		t.Fatal("adaptertest: Harness.Open is nil")
	}
	if h.Timeout <= 0 {
		h.Timeout = DefaultTimeout
	}
	cases := []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"PublishReceive", testPublishReceive},
		{"SinkDropsHopHeaders", testSinkDropsHopHeaders},
		{"PublishReportsPerMessage", testPublishPerMessage},
		{"CrashBeforeAckRedelivers", testCrashBeforeAck},
		{"RedeliveryDelayHonoured", testRedeliveryDelay},
		{"AttemptCountIncrements", testAttempts},
		{"DeadLetterKeepsEverything", testDeadLetterEnvelope},
		{"PermanentDeadLettersAtOnce", testPermanentAtOnce},
		{"PerKeyOrderUnderConcurrency", testPerKeyOrder},
		{"NothingLostAcrossRestart", testRestart},
		{"DrainOnShutdown", testDrain},
		{"InFlightBounded", testInFlightBounded},
		{"RecycleKeepsInFlight", testRecycler},
		{"BatchAckSettles", testBatchAck},
		{"DetachKeepsMessage", testDetacher},
		{"InvalidatorTells", testInvalidator},
		{"LeaseExtendedOrExpired", testLease},
		{"ExtendAfterSettleChangesNothing", testExtendAfterSettle},
		{"SettleAfterCloseFails", testSettleAfterClose},
		{"SecondSettleFails", testSecondSettle},
		{"ReleaseNotOvertaken", testReleaseNotOvertaken},
		{"ReleasedLaneNotOvertaken", testReleasedLaneNotOvertaken},
		{"BatchPoisonDeadLetteredAlone", testBatchPoisonAlone},
		{"BatchWholeFailureIsolates", testBatchWholeFailureIsolates},
		{"BatchKeyOrder", testBatchKeyOrder},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.fn(t, h) })
	}
}

// uniq returns a random suffix for event IDs.
func uniq() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// batch builds n messages over keys keys with IDs unique to this run.
func batch(n, keys int) []*ackwise.Message {
	run := uniq()
	out := make([]*ackwise.Message, n)
	for i := range out {
		out[i] = &ackwise.Message{
			ID:      fmt.Sprintf("%s-%d", run, i),
			Key:     fmt.Sprintf("key-%d", i%keys),
			Payload: []byte(strconv.Itoa(i)),
			Headers: ackwise.HeadersOf("x-seq", strconv.Itoa(i)),
		}
	}
	return out
}

func (h Harness) publish(t *testing.T, f Fixture, msgs []*ackwise.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	// Publish one at a time: per-key order is only defined for sequential
	// publishes.
	for _, m := range msgs {
		if err := f.Sink.Publish(ctx, m); err != nil {
			t.Fatalf("publish %s: %v", m.ID, err)
		}
	}
}

// receiveOne receives exactly one message from src directly, without the
// engine.
func (h Harness) receiveOne(t *testing.T, src adapters.Source) *ackwise.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	buf := make([]*ackwise.Message, 1)
	for {
		n, err := src.Receive(ctx, buf)
		if n == 1 {
			return buf[0]
		}
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
	}
}

// progress is state guarded by mu whose changes are signalled, so that a
// test can wait for a condition over it (waitFor).
type progress struct {
	mu      sync.Mutex
	changed chan struct{}
	timeout time.Duration // bounds waitFor
}

func (h Harness) newProgress() progress {
	return progress{changed: make(chan struct{}, 1), timeout: h.Timeout}
}

// signal wakes waitFor after a change; call it with mu not held.
func (p *progress) signal() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// waitFor waits until cond holds, checked with mu held.
func (p *progress) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(p.timeout)
	for {
		p.mu.Lock()
		ok := cond()
		p.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-p.changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// recorder is a handler that records what it saw and signals progress.
type recorder struct {
	progress
	seen []*ackwise.Message // copies
	byID map[string]int
	fn   func(context.Context, *ackwise.Message) error
}

func (h Harness) newRecorder(fn func(context.Context, *ackwise.Message) error) *recorder {
	return &recorder{progress: h.newProgress(), byID: map[string]int{}, fn: fn}
}

func (r *recorder) Handle(ctx context.Context, m *ackwise.Message) error {
	var err error
	if r.fn != nil {
		err = r.fn(ctx, m)
	}
	cp := *m
	cp.Payload = bytes.Clone(m.Payload)
	cp.Headers = m.Headers.Clone()
	cp.Handle = nil
	r.mu.Lock()
	r.seen = append(r.seen, &cp)
	r.byID[m.ID]++
	r.mu.Unlock()
	r.signal()
	return err
}

// start runs a consumer on src until the test ends or stop is called.
func (h Harness) start(t *testing.T, src adapters.Source, handler ackwise.Handler, cfg consumer.Config) (c *consumer.Consumer, stop func() error) {
	t.Helper()
	c, err := consumer.New(src, handler, cfg)
	if err != nil {
		t.Fatalf("consumer.New: %v", err)
	}
	return c, h.run(t, c)
}

// run runs c until the test ends or stop is called.
func (h Harness) run(t *testing.T, c *consumer.Consumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(h.Timeout):
				runErr = errors.New("adaptertest: Run did not return after cancel")
			}
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("consumer Run: %v", err)
		}
	})
	return stop
}

// waitDeadLetters polls the dead-letter destination until it holds n
// messages; a broker's dead-letter queue offers no notification to await.
func (h Harness) waitDeadLetters(t *testing.T, f Fixture, n int) []*ackwise.Message {
	t.Helper()
	deadline := time.Now().Add(h.Timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
		got := f.DeadLetters(ctx, t)
		cancel()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead letters: got %d, want %d", len(got), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ids returns the IDs of msgs.
func ids(msgs []*ackwise.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

// requireNothingMore fails the test if src delivers anything within wait.
func requireNothingMore(ctx context.Context, t *testing.T, src adapters.Source, wait time.Duration, when string) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	buf := make([]*ackwise.Message, 1)
	if n, _ := src.Receive(wctx, buf); n > 0 {
		t.Fatalf("received %s (attempt %d) %s", buf[0].ID, buf[0].Attempt, when)
	}
}
