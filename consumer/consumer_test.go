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
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

func msgs(n, keys int) []*ackwise.Message {
	out := make([]*ackwise.Message, n)
	for i := range out {
		out[i] = &ackwise.Message{
			ID:        fmt.Sprintf("e%d", i),
			Key:       fmt.Sprintf("k%d", i%keys),
			Payload:   []byte(strconv.Itoa(i)),
			Source:    "orders",
			Partition: -1,
			Offset:    -1,
			Attempt:   1,
		}
	}
	return out
}

// run starts c and returns a function that stops it and returns Run's error.
func run(t *testing.T, c *consumer.Consumer) func() error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second): // a hang detector: generous on a busy machine
				t.Fatal("Run did not return after cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func TestAcksAfterHandlerReturned(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(200, 10)...)
	var handled atomic.Int64
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
		// Invariant 1: the message is not acked while its handler runs.
		src.mu.Lock()
		for _, a := range src.acked {
			if a == m {
				t.Errorf("message %s acked before its handler returned", m.ID)
			}
		}
		src.mu.Unlock()
		handled.Add(1)
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	if !src.waitSettled(200, 5*time.Second) {
		t.Fatalf("settled %d of 200", len(src.acked))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := handled.Load(); got != 200 {
		t.Fatalf("handled %d, want 200", got)
	}
	if st := c.Stats(); st.Acked != 200 || st.InFlight != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPerKeyOrderAndBoundedInFlight(t *testing.T) {
	t.Parallel()
	const n, keys = 2000, 7
	src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(n, keys)...)
	var mu sync.Mutex
	running := map[string]bool{}
	last := map[string]int{}
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
		mu.Lock()
		if running[m.Key] {
			t.Errorf("key %s handled concurrently", m.Key)
		}
		running[m.Key] = true
		i, _ := strconv.Atoi(string(m.Payload))
		if prev, ok := last[m.Key]; ok && prev > i {
			t.Errorf("key %s: %d after %d", m.Key, i, prev)
		}
		last[m.Key] = i
		mu.Unlock()
		mu.Lock()
		running[m.Key] = false
		mu.Unlock()
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{Concurrency: 8, MaxInFlight: 32})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	if !src.waitSettled(n, 10*time.Second) {
		t.Fatal("not all settled")
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if src.maxOut > 32 {
		t.Fatalf("in flight reached %d, limit 32", src.maxOut)
	}
}

func TestClassification(t *testing.T) {
	t.Parallel()
	errBoom := errors.New("boom")
	type validationError struct{ error }
	cases := []struct {
		name   string
		err    error
		panic  bool
		check  func(t *testing.T, s *fakeSource)
		policy retry.Policy
	}{
		{name: "transient is nacked with backoff", err: errBoom, check: func(t *testing.T, s *fakeSource) {
			if len(s.nacked) != 1 || s.nacked[0].delay <= 0 {
				t.Fatalf("nacked %+v", s.nacked)
			}
		}},
		{name: "rate limited waits what it asked", err: fmt.Errorf("call: %w", ackwise.RetryAfter(errBoom, 42*time.Second)), check: func(t *testing.T, s *fakeSource) {
			if len(s.nacked) != 1 || s.nacked[0].delay != 42*time.Second {
				t.Fatalf("nacked %+v", s.nacked)
			}
		}},
		{name: "permanent is dead-lettered at once", err: fmt.Errorf("decode: %w", ackwise.Permanent(errBoom)), check: func(t *testing.T, s *fakeSource) {
			if len(s.dead) != 1 || s.dead[0].env.Reason != dlq.ReasonPermanent || s.dead[0].env.ErrorClass != "permanent" {
				t.Fatalf("dead %+v", s.dead)
			}
		}},
		{name: "classifier maps an application error", err: validationError{errBoom}, check: func(t *testing.T, s *fakeSource) {
			if len(s.dead) != 1 || s.dead[0].env.Reason != dlq.ReasonPermanent {
				t.Fatalf("dead %+v", s.dead)
			}
		}},
		{name: "discard acks", err: ackwise.Discard(errBoom), check: func(t *testing.T, s *fakeSource) {
			if len(s.acked) != 1 || len(s.dead) != 0 {
				t.Fatalf("acked %d dead %d", len(s.acked), len(s.dead))
			}
		}},
		{name: "panic is permanent", panic: true, check: func(t *testing.T, s *fakeSource) {
			if len(s.dead) != 1 || !strings.Contains(s.dead[0].env.Error, "panic: kaboom") {
				t.Fatalf("dead %+v", s.dead)
			}
		}},
		{name: "last attempt is dead-lettered max-attempts", err: errBoom, policy: retry.Policy{MaxAttempts: 1}, check: func(t *testing.T, s *fakeSource) {
			if len(s.dead) != 1 || s.dead[0].env.Reason != dlq.ReasonMaxAttempts || s.dead[0].env.Attempts != 1 {
				t.Fatalf("dead %+v", s.dead)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(1, 1)...)
			h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
				if tc.panic {
					panic("kaboom")
				}
				return tc.err
			})
			c, err := consumer.New(src, h, consumer.Config{
				Name:  "billing",
				Retry: tc.policy,
				Classifiers: []ackwise.Classifier{func(err error) (ackwise.Classification, bool) {
					var v validationError
					if errors.As(err, &v) {
						return ackwise.Classification{Class: ackwise.ClassPermanent}, true
					}
					return ackwise.Classification{}, false
				}},
			})
			if err != nil {
				t.Fatal(err)
			}
			run(t, c)
			if !src.waitSettled(1, 5*time.Second) {
				t.Fatal("not settled")
			}
			src.mu.Lock()
			defer src.mu.Unlock()
			tc.check(t, src)
			for _, d := range src.dead {
				if d.env.Consumer != "billing" || d.env.Source != "orders" || d.env.LastFailure.IsZero() {
					t.Fatalf("envelope %+v", d.env)
				}
			}
		})
	}
}

func TestInPlaceRetryHoldsKeyOnly(t *testing.T) {
	t.Parallel()
	// An ordered source: retries wait in place and hold back their key.
	all := msgs(4, 2) // k0: e0, e2; k1: e1, e3
	src := newFakeSource(adapters.Capabilities{Ordered: true, Log: true}, all...)
	var mu sync.Mutex
	var order []string
	failed := false
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if m.ID == "e0" && !failed {
			failed = true
			return errors.New("flaky")
		}
		order = append(order, fmt.Sprintf("%s@%d", m.ID, m.Attempt))
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{Retry: retry.Policy{InitialInterval: 20 * time.Millisecond, Jitter: retry.NoJitter}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	if !src.waitSettled(4, 5*time.Second) {
		t.Fatal("not settled")
	}
	mu.Lock()
	defer mu.Unlock()
	pos := map[string]int{}
	for i, s := range order {
		pos[s] = i
	}
	if _, ok := pos["e0@2"]; !ok {
		t.Fatalf("e0 not retried as attempt 2: %v", order)
	}
	if pos["e2@1"] < pos["e0@2"] {
		t.Fatalf("e2 ran before e0's retry on the same key: %v", order)
	}
	if pos["e1@1"] > pos["e0@2"] {
		t.Fatalf("key k1 waited for k0's retry: %v", order)
	}
	if len(src.nacked) != 0 {
		t.Fatalf("in-place retry went through the broker: %v", src.nacked)
	}
}

func TestDrainLetsRunningHandlersFinishAndReleasesTheRest(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(10, 1)...) // one key: one at a time
	started := make(chan struct{})
	finish := make(chan struct{})
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
		if m.ID == "e0" {
			close(started)
			<-finish
		}
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{DrainTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// Run must wait for the running handler.
	select {
	case <-stopped:
		t.Fatal("Run returned while a handler was running")
	case <-time.After(50 * time.Millisecond):
	}
	close(finish)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if len(src.acked) != 1 || src.acked[0].ID != "e0" {
		t.Fatalf("acked %d messages, want only e0", len(src.acked))
	}
	if len(src.released)+len(src.queue) != 9 {
		t.Fatalf("released %d, queued %d: want the other 9 unacked", len(src.released), len(src.queue))
	}
}

func TestDrainTimeoutCancelsHandlersAndSettlesNothing(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{Delay: true}, msgs(1, 1)...)
	started := make(chan struct{})
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	})
	c, err := consumer.New(src, h, consumer.Config{DrainTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	<-started
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if len(src.acked)+len(src.dead)+len(src.nacked) != 0 || len(src.released) != 1 {
		t.Fatalf("acked %d dead %d nacked %d released %d", len(src.acked), len(src.dead), len(src.nacked), len(src.released))
	}
}

func TestSourceClosedEndsRun(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{})
	c, err := consumer.New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil }), consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	src.Close()
	if err := <-done; !errors.Is(err, adapters.ErrClosed) {
		t.Fatalf("Run = %v, want ErrClosed", err)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })
	src := newFakeSource(adapters.Capabilities{})
	cases := []struct {
		cfg  consumer.Config
		want string
	}{
		{consumer.Config{Concurrency: -1}, "Concurrency = -1"},
		{consumer.Config{Concurrency: 8, MaxInFlight: 4}, "MaxInFlight = 4 is below Concurrency = 8"},
		// Sizes the engine would allocate: before, New accepted them and
		// Run panicked (makechan: size out of range), or Concurrency × 16
		// wrapped to a MaxInFlight of 0.
		{consumer.Config{MaxInFlight: 1 << 50}, "MaxInFlight = 1125899906842624: at most MaxInFlightMax"},
		{consumer.Config{Concurrency: 1 << 60}, "Concurrency = 1152921504606846976: at most MaxConcurrency"},
		{consumer.Config{Concurrency: consumer.MaxConcurrency + 1, MaxInFlight: consumer.MaxInFlightMax}, "Concurrency = 65537"},
		{consumer.Config{Ordering: 9}, "Ordering = 9"},
		{consumer.Config{RetryMode: consumer.RetryBroker}, "cannot delay redelivery (Capabilities.Delay is false): name delay tiers"},
		{consumer.Config{DrainTimeout: -5}, "DrainTimeout = -5ns"},
		{consumer.Config{Retry: retry.Policy{Multiplier: 0.5}}, "Multiplier = 0.5"},
		{consumer.Config{Retry: retry.Policy{Jitter: 2}}, "Jitter = 2"},
		{consumer.Config{Middleware: []ackwise.Middleware{nil}}, "Middleware[0] is nil"},
		{consumer.Config{Breaker: &consumer.Breaker{Threshold: -3}}, "Breaker.Threshold = -3"},
	}
	for _, tc := range cases {
		_, err := consumer.New(src, h, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want error containing %q", tc.cfg, err, tc.want)
		}
	}
	// The largest Concurrency is valid, its default MaxInFlight capped.
	c, err := consumer.New(src, h, consumer.Config{Concurrency: consumer.MaxConcurrency})
	if err != nil {
		t.Fatalf("Concurrency = MaxConcurrency refused: %v", err)
	}
	if got := consumer.MaxInFlightOf(c); got != consumer.MaxInFlightMax {
		t.Errorf("MaxInFlight defaulted to %d, want MaxInFlightMax", got)
	}
	if _, err := consumer.New(nil, h, consumer.Config{}); err == nil {
		t.Error("nil source accepted")
	}
	if _, err := consumer.New(src, nil, consumer.Config{}); err == nil {
		t.Error("nil handler accepted")
	}
}
