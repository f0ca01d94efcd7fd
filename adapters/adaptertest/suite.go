package adaptertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
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
	"github.com/ackwise/ackwise/retry"
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

// recorder is a handler that records what it saw and signals progress.
type recorder struct {
	mu      sync.Mutex
	seen    []*ackwise.Message // copies
	byID    map[string]int
	changed chan struct{}
	fn      func(context.Context, *ackwise.Message) error
	timeout time.Duration // bounds waitFor
}

func (h Harness) newRecorder(fn func(context.Context, *ackwise.Message) error) *recorder {
	return &recorder{byID: map[string]int{}, changed: make(chan struct{}, 1), fn: fn, timeout: h.Timeout}
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
	select {
	case r.changed <- struct{}{}:
	default:
	}
	return err
}

// waitFor waits until cond holds over the recorder's state.
func (r *recorder) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(r.timeout)
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// start runs a consumer on src until the test ends or stop is called.
func (h Harness) start(t *testing.T, src adapters.Source, handler ackwise.Handler, cfg consumer.Config) (c *consumer.Consumer, stop func() error) {
	t.Helper()
	c, err := consumer.New(src, handler, cfg)
	if err != nil {
		t.Fatalf("consumer.New: %v", err)
	}
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
	return c, stop
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

func testPublishReceive(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{})
	in := batch(20, 5)
	in[0].Payload = []byte{0, 0xff, 0xfe, '\n', 0x80} // not UTF-8
	in[0].Headers.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	h.publish(t, f, in)
	rec := h.newRecorder(nil)
	h.start(t, f.NewSource(t), rec, consumer.Config{})
	rec.waitFor(t, "20 messages", func() bool { return len(rec.byID) == len(in) })
	rec.mu.Lock()
	defer rec.mu.Unlock()
	byID := map[string]*ackwise.Message{}
	for _, m := range rec.seen {
		byID[m.ID] = m
	}
	for _, want := range in {
		got := byID[want.ID]
		if got == nil {
			t.Fatalf("message %s not received", want.ID)
		}
		if !bytes.Equal(got.Payload, want.Payload) {
			t.Errorf("%s payload %q, want %q", want.ID, got.Payload, want.Payload)
		}
		if got.Key != want.Key {
			t.Errorf("%s key %q, want %q", want.ID, got.Key, want.Key)
		}
		for _, kv := range want.Headers {
			k, v := kv.Key, kv.Value
			if got.Headers.Get(k) != v {
				t.Errorf("%s header %s = %q, want %q", want.ID, k, got.Headers.Get(k), v)
			}
		}
		if got.Headers.Get(ackwise.HeaderEventID) != want.ID {
			t.Errorf("%s: header %s = %q", want.ID, ackwise.HeaderEventID, got.Headers.Get(ackwise.HeaderEventID))
		}
		if got.Attempt != 1 {
			t.Errorf("%s attempt %d, want 1", want.ID, got.Attempt)
		}
		if got.Source == "" {
			t.Errorf("%s: Source not set", want.ID)
		}
	}
}

// testSinkDropsHopHeaders: a message published through the Sink with the
// engine's hop headers (a handler forwarding the headers of a retry it
// handled) arrives as a new message: at attempt 1, without them.
func testSinkDropsHopHeaders(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{})
	in := batch(1, 1)
	in[0].Headers.Set(ackwise.HeaderAttempt, "4")
	in[0].Headers.Set(ackwise.HeaderFirstFailure, "2026-01-02T03:04:05Z")
	in[0].Headers.Set("x-kept", "yes")
	h.publish(t, f, in)
	got := h.receiveOne(t, f.NewSource(t))
	if got.Attempt != 1 || !got.FirstFailure.IsZero() {
		t.Errorf("attempt %d, first failure %v: want 1 and none", got.Attempt, got.FirstFailure)
	}
	for _, k := range []string{ackwise.HeaderAttempt, ackwise.HeaderFirstFailure} {
		if got.Headers.Has(k) {
			t.Errorf("header %s = %q published", k, got.Headers.Get(k))
		}
	}
	if got.Headers.Get("x-kept") != "yes" {
		t.Errorf("header x-kept = %q, want the other headers kept", got.Headers.Get("x-kept"))
	}
}

// testPublishPerMessage: when the broker refuses the last message of a
// Publish call, Publish returns an *adapters.PublishError that lists it
// alone; the others are confirmed, and delivered, and the refused one is
// never delivered.
func testPublishPerMessage(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{})
	if f.Refuse == nil {
		t.Skip("the harness cannot make the broker refuse one message alone (Fixture.Refuse nil): per-message publish errors not checked")
	}
	in := batch(3, 1)
	bad := len(in) - 1
	f.Refuse(t, in[bad])
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	err := f.Sink.Publish(ctx, in...)
	pe, ok := errors.AsType[*adapters.PublishError](err)
	if !ok || len(pe.Failed) != 1 || pe.Failed[0].Index != bad {
		t.Fatalf("Publish = %v, want an *adapters.PublishError listing msgs[%d] alone", err, bad)
	}
	src := f.NewSource(t)
	want := map[string]bool{in[0].ID: true, in[1].ID: true}
	for len(want) > 0 {
		m := h.receiveOne(t, src)
		if !want[m.ID] {
			t.Fatalf("received %s, want one of the confirmed %v", m.ID, want)
		}
		delete(want, m.ID)
		if err := src.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	requireNothingMore(ctx, t, src, time.Second, "after the confirmed messages: the refused one was stored")
}

func testCrashBeforeAck(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{Lease: time.Second})
	in := batch(1, 1)
	h.publish(t, f, in)
	src := f.NewSource(t)
	first := h.receiveOne(t, src)
	if first.ID != in[0].ID {
		t.Fatalf("received %s, want %s", first.ID, in[0].ID)
	}
	// The handler ran, the process died before the ack.
	if err := src.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	again := h.receiveOne(t, f.NewSource(t))
	if again.ID != in[0].ID || !bytes.Equal(again.Payload, in[0].Payload) {
		t.Fatalf("redelivered %s %q, want %s %q", again.ID, again.Payload, in[0].ID, in[0].Payload)
	}
	if caps := src.Capabilities(); caps.DeliveryCount && again.Attempt < 2 {
		t.Fatalf("redelivery attempt %d, want ≥ 2 on a broker that counts deliveries", again.Attempt)
	}
}

func testRedeliveryDelay(t *testing.T, h Harness) {
	const delay = 300 * time.Millisecond
	f := h.Open(t, FixtureConfig{DelayTiers: []time.Duration{delay}})
	src := f.NewSource(t)
	if !src.Capabilities().Delay {
		t.Skip("source cannot delay redelivery (Capabilities.Delay false): the engine retries in place; checked by AttemptCountIncrements")
	}
	in := batch(1, 1)
	h.publish(t, f, in)
	m := h.receiveOne(t, src)
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	at := time.Now()
	if err := src.Nack(ctx, m, delay); err != nil {
		t.Fatalf("nack: %v", err)
	}
	again := h.receiveOne(t, src)
	if waited := time.Since(at); waited < delay-20*time.Millisecond {
		t.Fatalf("redelivered after %v, want at least %v", waited, delay)
	}
	if again.ID != in[0].ID || again.Attempt != 2 {
		t.Fatalf("redelivered %s attempt %d, want %s attempt 2", again.ID, again.Attempt, in[0].ID)
	}
	if err := src.Ack(ctx, again); err != nil {
		t.Fatalf("ack: %v", err)
	}
}

func testAttempts(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{DelayTiers: []time.Duration{100 * time.Millisecond}})
	in := batch(1, 1)
	h.publish(t, f, in)
	rec := h.newRecorder(func(context.Context, *ackwise.Message) error { return errors.New("still down") })
	h.start(t, f.NewSource(t), rec, consumer.Config{Retry: retry.Policy{MaxAttempts: 3, InitialInterval: 50 * time.Millisecond, Jitter: retry.NoJitter}})
	rec.waitFor(t, "3 attempts", func() bool { return len(rec.seen) >= 3 })
	dl := h.waitDeadLetters(t, f, 1)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i, m := range rec.seen[:3] {
		if m.Attempt != i+1 {
			t.Fatalf("delivery %d had attempt %d", i+1, m.Attempt)
		}
	}
	env, err := dlq.Decode(dl[0].Headers)
	if err != nil {
		t.Fatal(err)
	}
	if env.Reason != dlq.ReasonMaxAttempts || env.Attempts != 3 {
		t.Fatalf("envelope reason %s attempts %d, want max-attempts 3", env.Reason, env.Attempts)
	}
	if !env.FirstFailure.Before(env.LastFailure) {
		t.Fatalf("first failure %v not before last %v", env.FirstFailure, env.LastFailure)
	}
}

func testDeadLetterEnvelope(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{})
	in := batch(1, 1)
	in[0].Payload = append([]byte{0xde, 0xad, 0xbe, 0xef, 0}, bytes.Repeat([]byte("x"), 4096)...)
	in[0].Headers.Set("x-tenant", "acme")
	h.publish(t, f, in)
	long := string(bytes.Repeat([]byte("e"), 5000))
	rec := h.newRecorder(func(context.Context, *ackwise.Message) error {
		return ackwise.Permanent(errors.New(long))
	})
	h.start(t, f.NewSource(t), rec, consumer.Config{Name: "billing", Version: "v1.2.3"})
	dl := h.waitDeadLetters(t, f, 1)[0]
	if !bytes.Equal(dl.Payload, in[0].Payload) {
		t.Fatalf("dead letter payload differs: %d bytes, want %d", len(dl.Payload), len(in[0].Payload))
	}
	if dl.Headers.Get("x-tenant") != "acme" || dl.Headers.Get("x-seq") != "0" {
		t.Fatalf("original headers lost: %v", dl.Headers)
	}
	if dl.Headers.Get(ackwise.HeaderEventID) != in[0].ID {
		t.Fatalf("event id header %q, want %q", dl.Headers.Get(ackwise.HeaderEventID), in[0].ID)
	}
	env, err := dlq.Decode(dl.Headers)
	if err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	seen := rec.seen[0]
	rec.mu.Unlock()
	switch {
	case env.Reason != dlq.ReasonPermanent:
		t.Errorf("reason %q", env.Reason)
	case env.ErrorClass != "permanent":
		t.Errorf("error class %q", env.ErrorClass)
	case len(env.Error) > dlq.MaxErrorLen || len(env.Error) < 100:
		t.Errorf("error text %d bytes, want bounded to %d", len(env.Error), dlq.MaxErrorLen)
	case env.Source != seen.Source || env.Source == "":
		t.Errorf("source %q, want %q", env.Source, seen.Source)
	case env.MessageID != seen.BrokerID:
		t.Errorf("message id %q, want %q", env.MessageID, seen.BrokerID)
	case env.Partition != seen.Partition || env.Offset != seen.Offset:
		t.Errorf("position %d@%d, want %d@%d", env.Partition, env.Offset, seen.Partition, seen.Offset)
	case env.Attempts != 1:
		t.Errorf("attempts %d", env.Attempts)
	case env.FirstFailure.IsZero() || env.LastFailure.IsZero():
		t.Errorf("failure times %v %v", env.FirstFailure, env.LastFailure)
	case env.Consumer != "billing" || env.ConsumerVersion != "v1.2.3":
		t.Errorf("consumer %q %q", env.Consumer, env.ConsumerVersion)
	}
}

func testPermanentAtOnce(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{})
	in := batch(3, 3)
	h.publish(t, f, in)
	rec := h.newRecorder(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == in[1].ID {
			return fmt.Errorf("decode: %w", ackwise.Permanent(errors.New("bad json")))
		}
		return nil
	})
	h.start(t, f.NewSource(t), rec, consumer.Config{})
	dl := h.waitDeadLetters(t, f, 1)
	rec.waitFor(t, "all handled", func() bool { return len(rec.byID) == 3 })
	if len(dl) != 1 || dl[0].Headers.Get(ackwise.HeaderEventID) != in[1].ID {
		t.Fatalf("dead letters %d, want only %s", len(dl), in[1].ID)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.byID[in[1].ID] != 1 {
		t.Fatalf("poison message handled %d times, want 1", rec.byID[in[1].ID])
	}
}

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

// testLease checks leases where the source has them: a delivery whose lease
// is extended stays with its consumer past the original lease, and one whose
// lease runs out goes to another consumer, after which the first
// consumer's receipt no longer settles it (ErrReceiptInvalid, Valid false).
func testLease(t *testing.T, h Harness) {
	const lease = 2 * time.Second
	f := h.Open(t, FixtureConfig{Lease: lease})
	a := f.NewSource(t)
	caps := a.Capabilities()
	if caps.Lease == 0 {
		t.Skip("deliveries have no lease (Capabilities.Lease 0): a delivery stays with its consumer until settled or the consumer goes; checked by CrashBeforeAckRedelivers")
	}
	if caps.Lease > lease {
		t.Fatalf("Capabilities.Lease %v: the harness did not give the %v the case asked for", caps.Lease, lease)
	}
	in := batch(2, 2) // in[0]: its lease is extended; in[1]: left to run out
	h.publish(t, f, in)
	got := map[string]*ackwise.Message{}
	for len(got) < 2 {
		m := h.receiveOne(t, a)
		got[m.ID] = m
	}
	kept, lapsed := got[in[0].ID], got[in[1].ID]
	if kept == nil || lapsed == nil {
		t.Fatalf("received %v, want %s and %s", got, in[0].ID, in[1].ID)
	}

	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	stop := make(chan struct{})
	extended := make(chan error, 1)
	if caps.ExtendLease {
		go func() {
			tick := time.NewTicker(caps.Lease / 4)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					extended <- nil
					return
				case <-tick.C:
					if err := a.ExtendLease(ctx, kept, caps.Lease); err != nil {
						extended <- fmt.Errorf("ExtendLease: %w", err)
						return
					}
				}
			}
		}()
	} else {
		t.Log("the source cannot extend a lease (Capabilities.ExtendLease false): only expiry is checked")
	}

	// Another consumer gets the lapsed delivery once its lease ran out,
	// and not the one whose lease is being extended.
	b := f.NewSource(t)
	start := time.Now()
	again := h.receiveOne(t, b)
	if again.ID != lapsed.ID {
		t.Fatalf("the second consumer received %s, want %s (its lease ran out; %s's was extended)", again.ID, lapsed.ID, kept.ID)
	}
	if caps.ExtendLease {
		close(stop)
		if err := <-extended; err != nil {
			t.Fatal(err)
		}
		if !a.Valid(kept) {
			t.Fatalf("Valid(%s) false after its lease was extended", kept.ID)
		}
		if err := a.Ack(ctx, kept); err != nil {
			t.Fatalf("Ack of the delivery whose lease was extended: %v", err)
		}
	}
	// The first consumer may learn of the expiry a little after the broker
	// acted on it (its clock for the lease starts when the delivery
	// arrived), but not much later.
	for deadline := time.Now().Add(time.Second); a.Valid(lapsed); {
		if time.Now().After(deadline) {
			t.Fatalf("Valid(%s) still true a second after its lease ran out and it was delivered again", lapsed.ID)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition that has no signal
	}
	if err := a.Ack(ctx, lapsed); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("Ack with the receipt whose lease ran out: %v, want ErrReceiptInvalid", err)
	}
	if err := b.Ack(ctx, again); err != nil {
		t.Fatalf("Ack of the redelivery: %v", err)
	}
	// Both are settled: neither comes back within a lease and a half.
	requireNothingMore(ctx, t, b, caps.Lease*3/2, fmt.Sprintf("after both were acked; %v since the redelivery began", time.Since(start)))
}

// testExtendAfterSettle: the engine's heartbeat extends leases concurrently
// with settles, so an ExtendLease can reach the source after the message
// was settled. It must change nothing: a released (or nacked without
// delay) message is still delivered again at once, not held for the lease
// the late extension asked for, and an acked one never comes back.
func testExtendAfterSettle(t *testing.T, h Harness) {
	const lease = 2 * time.Second
	f := h.Open(t, FixtureConfig{Lease: lease})
	src := f.NewSource(t)
	caps := src.Capabilities()
	if !caps.ExtendLease {
		t.Skip("the source cannot extend a lease (Capabilities.ExtendLease false): nothing to check")
	}
	n := 2
	if caps.Delay {
		n = 3
	}
	in := batch(n, n)
	h.publish(t, f, in)
	got := map[string]*ackwise.Message{}
	for len(got) < n {
		m := h.receiveOne(t, src)
		got[m.ID] = m
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	acked, released := got[in[0].ID], got[in[1].ID]
	if err := src.Ack(ctx, acked); err != nil {
		t.Fatal(err)
	}
	if err := src.Release(ctx, released); err != nil {
		t.Fatal(err)
	}
	settled := []*ackwise.Message{acked, released}
	want := map[string]bool{released.ID: true}
	if caps.Delay {
		nacked := got[in[2].ID]
		if err := src.Nack(ctx, nacked, 0); err != nil {
			t.Fatal(err)
		}
		settled = append(settled, nacked)
		want[nacked.ID] = true
	}
	extendedAt := time.Now()
	for _, m := range settled {
		if err := src.ExtendLease(ctx, m, caps.Lease); err != nil && !errors.Is(err, adapters.ErrReceiptInvalid) {
			t.Fatalf("ExtendLease of settled %s: %v, want nil or ErrReceiptInvalid", m.ID, err)
		}
	}
	// The redeliveries come well before the extended lease would end.
	wait, cancelWait := context.WithTimeout(ctx, caps.Lease*3/4)
	defer cancelWait()
	buf := make([]*ackwise.Message, 1)
	for len(want) > 0 {
		k, err := src.Receive(wait, buf)
		if k == 0 {
			t.Fatalf("%v not delivered again %v after it was settled and then extended (err %v): the late extension held it", want, time.Since(extendedAt), err)
		}
		m := buf[0]
		if !want[m.ID] {
			t.Fatalf("received %s (attempt %d): it was acked before the late extension", m.ID, m.Attempt)
		}
		delete(want, m.ID)
		if err := src.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
}

// testSettleAfterClose: a consumer closed with deliveries in hand (a
// handler outlived the drain, the process is going down) can no longer
// settle them. Ack, Nack and DeadLetter fail rather than report a
// settlement Close already gave up; DeadLetter writes no dead letter and
// Nack no delayed copy; Release changes nothing (it is never an ack); and
// Valid is false. The next consumer gets every message, each once.
func testSettleAfterClose(t *testing.T, h Harness) {
	const tier = 200 * time.Millisecond
	f := h.Open(t, FixtureConfig{Lease: time.Second, DelayTiers: []time.Duration{tier}})
	src := f.NewSource(t)
	caps := src.Capabilities()
	in := batch(4, 4) // acked, released, nacked, dead-lettered
	h.publish(t, f, in)
	got := map[string]*ackwise.Message{}
	for len(got) < len(in) {
		m := h.receiveOne(t, src)
		got[m.ID] = m
	}
	if err := src.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	for _, m := range in {
		if src.Valid(got[m.ID]) {
			t.Errorf("Valid(%s) true after Close", m.ID)
		}
	}
	failed := func(op string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s after Close: nil, want an error (ErrReceiptInvalid or ErrClosed): the delivery was given up by Close", op)
		}
	}
	failed("Ack", src.Ack(ctx, got[in[0].ID]))
	if err := src.Release(ctx, got[in[1].ID]); err != nil {
		t.Logf("Release after Close: %v (allowed: the message comes back either way)", err)
	}
	if caps.Delay {
		failed("Nack", src.Nack(ctx, got[in[2].ID], tier))
	} else {
		t.Log("source cannot delay redelivery (Capabilities.Delay false): Nack after Close not checked")
	}
	failed("DeadLetter", src.DeadLetter(ctx, got[in[3].ID], dlq.New(got[in[3].ID], dlq.ReasonPermanent, errors.New("late"), ackwise.ClassPermanent, time.Now(), "late", "v0")))

	// Every message comes back to the next consumer, and once: a Nack that
	// wrote a delayed copy shows as a second delivery after the tier.
	next := f.NewSource(t)
	seen := map[string]int{}
	for len(seen) < len(in) {
		m := h.receiveOne(t, next)
		seen[m.ID]++
		if seen[m.ID] > 1 {
			t.Fatalf("%s delivered twice to the next consumer", m.ID)
		}
		if err := next.Ack(ctx, m); err != nil {
			t.Fatalf("ack %s: %v", m.ID, err)
		}
	}
	for _, m := range in {
		if seen[m.ID] == 0 {
			t.Fatalf("%s not delivered again after Close (seen %v)", m.ID, seen)
		}
	}
	requireNothingMore(ctx, t, next, 3*tier, "after every message was acked: a settle after Close left a copy")
	if dl := f.DeadLetters(ctx, t); len(dl) != 0 {
		t.Fatalf("%d dead letters after a DeadLetter that Close had voided, want none", len(dl))
	}
}

// testSecondSettle: each delivery is settled at most once. A second settle
// of the same delivery (a caller's bug: a Release then a DeadLetter, an Ack
// then a Release) must fail without acting: no dead letter written for a
// message handed back, and no harm to the other deliveries of the source
// (on RabbitMQ a second ack of a delivery tag closes the channel, and every
// other delivery on it is redelivered).
func testSecondSettle(t *testing.T, h Harness) {
	f := h.Open(t, FixtureConfig{Lease: 2 * time.Second})
	src := f.NewSource(t)
	in := batch(3, 3) // released then dead-lettered, acked then released, bystander
	h.publish(t, f, in)
	got := map[string]*ackwise.Message{}
	for len(got) < len(in) {
		m := h.receiveOne(t, src)
		got[m.ID] = m
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	released, acked, bystander := got[in[0].ID], got[in[1].ID], got[in[2].ID]
	if err := src.Release(ctx, released); err != nil {
		t.Fatal(err)
	}
	env := dlq.New(released, dlq.ReasonPermanent, errors.New("after release"), ackwise.ClassPermanent, time.Now(), "t", "v0")
	if err := src.DeadLetter(ctx, released, env); err == nil {
		t.Errorf("DeadLetter of %s after its Release: nil, want an error", released.ID)
	}
	if err := src.Ack(ctx, acked); err != nil {
		t.Fatal(err)
	}
	if err := src.Release(ctx, acked); err == nil {
		t.Errorf("Release of %s after its Ack: nil, want an error", acked.ID)
	}
	if err := src.Ack(ctx, bystander); err != nil {
		t.Fatalf("Ack of another delivery after the second settles: %v", err)
	}
	// The released message comes back (once), the others do not.
	again := h.receiveOne(t, src)
	if again.ID != released.ID {
		t.Fatalf("received %s, want %s again (the only one handed back)", again.ID, released.ID)
	}
	if err := src.Ack(ctx, again); err != nil {
		t.Fatal(err)
	}
	requireNothingMore(ctx, t, src, time.Second, "after every message was acked")
	if dl := f.DeadLetters(ctx, t); len(dl) != 0 {
		t.Fatalf("%d dead letters, want none: the DeadLetter after a Release acted", len(dl))
	}
}

// testReleaseNotOvertaken: the messages behind a released message of its
// key do not overtake its redelivery where the source promises order. The
// case receives the first of several messages of one key (the source may
// have fetched or prefetched the others meanwhile) and releases it. On an
// ordered source (Capabilities.Ordered) the next delivery is the released
// message, then the others in publish order, each once. A source that does
// not promise order may hand out what it already sent first (a RabbitMQ
// consumer's prefetch): there the released message comes back and each
// message is delivered once, in any order.
func testReleaseNotOvertaken(t *testing.T, h Harness) {
	const n = 5
	f := h.Open(t, FixtureConfig{})
	in := batch(n, 1) // one key: one partition, one FIFO group
	h.publish(t, f, in)
	src := f.NewSource(t)
	ordered := src.Capabilities().Ordered
	first := h.receiveOne(t, src)
	if ordered && first.ID != in[0].ID {
		t.Fatalf("first delivery %s, want %s (the source is Ordered)", first.ID, in[0].ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
	defer cancel()
	if err := src.Release(ctx, first); err != nil {
		t.Fatalf("release: %v", err)
	}
	var order []string
	seen := map[string]bool{}
	for len(seen) < n {
		m := h.receiveOne(t, src)
		if seen[m.ID] {
			t.Fatalf("%s delivered twice after the release (order so far %v)", m.ID, order)
		}
		seen[m.ID] = true
		order = append(order, m.ID)
		if err := src.Ack(ctx, m); err != nil {
			t.Fatalf("ack %s: %v", m.ID, err)
		}
	}
	for _, m := range in {
		if !seen[m.ID] {
			t.Fatalf("%s not delivered after the release (got %v)", m.ID, order)
		}
	}
	if !ordered {
		t.Logf("source does not promise order (Capabilities.Ordered false): checked the released message comes back and each message comes once, not their order (received %v after releasing %s)", order, first.ID)
	} else {
		if want := ids(in); !slices.Equal(order, want) {
			t.Fatalf("after releasing %s received %v, want %v: a message behind the released one overtook it", first.ID, order, want)
		}
	}
	requireNothingMore(ctx, t, src, 500*time.Millisecond, "after every message was acked")
}

// invalidOnce is a source whose first Valid check says no, as when the
// delivery's partition was revoked or its channel died: the engine releases
// that message unrun. The check waits until the engine has received want
// messages, so that the others of its key wait behind it in its lane.
type invalidOnce struct {
	adapters.Source
	want     int64
	received atomic.Int64
	all      chan struct{} // closed once want messages were received
	once     sync.Once
	checked  atomic.Bool
	invalid  atomic.Pointer[string] // the ID of the message said no to
	gaveUp   atomic.Bool            // the check stopped waiting for all to be received
	timeout  time.Duration          // how long the check waits
}

func (s *invalidOnce) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	n, err := s.Source.Receive(ctx, buf)
	if s.received.Add(int64(n)) >= s.want {
		s.once.Do(func() { close(s.all) })
	}
	return n, err
}

func (s *invalidOnce) Valid(m *ackwise.Message) bool {
	if !s.checked.CompareAndSwap(false, true) {
		return s.Source.Valid(m)
	}
	id := m.ID
	s.invalid.Store(&id)
	select {
	case <-s.all:
	case <-time.After(s.timeout):
		s.gaveUp.Store(true)
	}
	return false
}

// Extensions drops Invalidator: invalidOnce's Valid says no where the
// wrapped source, which would tell the engine, says yes.
func (s *invalidOnce) Extensions() adapters.Extensions {
	ext := s.Source.Extensions()
	ext.Invalidator = nil
	return ext
}

// testReleasedLaneNotOvertaken: when the engine hands a message back to the
// broker unrun (here: its receipt is no longer valid) while the other
// messages of its key wait behind it in its lane, it releases them too,
// unrun, and the source delivers them again after it. On an ordered source
// the handler sees the key's messages in publish order, each once (the
// released message never ran before); on another, each once.
func testReleasedLaneNotOvertaken(t *testing.T, h Harness) {
	const n = 5
	f := h.Open(t, FixtureConfig{})
	in := batch(n, 1) // one key: one lane
	h.publish(t, f, in)
	src := &invalidOnce{Source: f.NewSource(t), want: n, all: make(chan struct{}), timeout: h.Timeout}
	ordered := src.Capabilities().Ordered
	rec := h.newRecorder(nil)
	_, stop := h.start(t, src, rec, consumer.Config{Concurrency: 4, MaxInFlight: 2 * n})
	rec.waitFor(t, "every message handled", func() bool { return len(rec.byID) == n })
	if err := stop(); err != nil {
		t.Fatalf("consumer: %v", err)
	}
	if src.gaveUp.Load() {
		t.Fatalf("the engine received %d of %d messages within %v", src.received.Load(), n, h.Timeout)
	}
	invalid := src.invalid.Load()
	if invalid == nil {
		t.Fatal("Valid was never called: the engine ran a handler without checking its receipt")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	got := ids(rec.seen)
	for id, k := range rec.byID {
		if k != 1 {
			t.Fatalf("%s handled %d times, want once (handled %v; %s was released unrun)", id, k, got, *invalid)
		}
	}
	if !ordered {
		t.Logf("source does not promise order (Capabilities.Ordered false): checked each message is handled once, not their order (handled %v; %s was released unrun)", got, *invalid)
		return
	}
	if *invalid != in[0].ID {
		t.Fatalf("first Valid check was of %s, want %s (the source is Ordered)", *invalid, in[0].ID)
	}
	if want := ids(in); !slices.Equal(got, want) {
		t.Fatalf("handled %v, want %v: a message behind the released %s overtook it", got, want, in[0].ID)
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
