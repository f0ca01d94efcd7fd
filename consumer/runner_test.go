package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
)

// runnerBundle is a memory broker with one queue, source and consumer per
// name, one message waiting on each queue, and handlers that report their
// start and then wait for release.
type runnerBundle struct {
	b         *memory.Broker
	names     []string
	srcs      []*memory.QueueSource
	consumers []*consumer.Consumer
	started   chan string   // a handler's consumer name, as it starts
	release   chan struct{} // closed to let the handlers return
}

func setupRunner(t *testing.T, cfg consumer.Config, names ...string) *runnerBundle {
	t.Helper()
	b, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tb := &runnerBundle{b: b, names: names, started: make(chan string, len(names)), release: make(chan struct{})}
	for _, name := range names {
		if err := b.Publish(t.Context(), name, &ackwise.Message{ID: name + "-1", Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		src, err := b.QueueSource(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close() })
		h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
			tb.started <- name
			<-tb.release
			return nil
		})
		cfg := cfg
		cfg.Name = name
		c, err := consumer.New(src, h, cfg)
		if err != nil {
			t.Fatal(err)
		}
		tb.srcs = append(tb.srcs, src)
		tb.consumers = append(tb.consumers, c)
	}
	return tb
}

// awaitHandlers waits until every consumer's handler has started: every
// consumer's Run was called.
func (tb *runnerBundle) awaitHandlers(t *testing.T) {
	t.Helper()
	for range tb.names {
		select {
		case <-tb.started:
		case <-time.After(10 * time.Second):
			t.Fatal("handlers did not start")
		}
	}
}

func (tb *runnerBundle) requireAcked(t *testing.T) {
	t.Helper()
	for _, name := range tb.names {
		st, err := tb.b.Stats(name)
		if err != nil || st.Acked != 1 || st.Ready != 0 {
			t.Fatalf("queue %s: %+v, %v; want its message acked", name, st, err)
		}
	}
}

// probe asks h for path and returns the status and body.
func probe(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

// awaitProbe waits until h answers path with code.
func awaitProbe(t *testing.T, h http.Handler, path string, code int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, body := probe(t, h, path)
		if got == code {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %d %q; want %d", path, got, body, code)
		}
		time.Sleep(time.Millisecond)
	}
}

func awaitRun(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Runner.Run did not return")
		return nil
	}
}

// TestRunnerDrainsEveryConsumer: cancelled, the Runner stops being ready,
// stays live while every consumer drains (their handlers finish and their
// messages are acked), and returns nil once all did.
func TestRunnerDrainsEveryConsumer(t *testing.T) {
	t.Parallel()
	tb := setupRunner(t, consumer.Config{}, "orders", "payments", "refunds")
	r, err := consumer.NewRunner(consumer.RunnerConfig{IgnoreSignals: true}, tb.consumers...)
	if err != nil {
		t.Fatal(err)
	}
	h := r.Handler()
	if code, _ := probe(t, h, "/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before Run = %d, want 503", code)
	}
	if code, _ := probe(t, h, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz before Run = %d, want 200", code)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	tb.awaitHandlers(t)

	// Served over HTTP, mounted under a prefix.
	srv := httptest.NewServer(http.StripPrefix("/probe", r.Handler()))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/probe/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "running\norders running\npayments running\nrefunds running\n" || !r.Ready() {
		t.Fatalf("/readyz while running = %d %q", resp.StatusCode, body)
	}
	if code, _ := probe(t, h, "/metrics"); code != http.StatusNotFound {
		t.Fatalf("/metrics = %d, want 404", code)
	}

	cancel()
	awaitProbe(t, h, "/readyz", http.StatusServiceUnavailable)
	if code, body := probe(t, h, "/healthz"); code != http.StatusOK || !strings.HasPrefix(body, "draining\n") {
		t.Fatalf("/healthz while draining = %d %q, want 200 draining", code, body)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned %v while handlers were running", err)
	default:
	}
	close(tb.release)
	if err := awaitRun(t, done); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	tb.requireAcked(t)
	if code, body := probe(t, h, "/healthz"); code != http.StatusServiceUnavailable || body != "stopped\norders stopped\npayments stopped\nrefunds stopped\n" {
		t.Fatalf("/healthz after Run = %d %q, want 503", code, body)
	}
	if code, _ := probe(t, h, "/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz after Run = %d, want 503", code)
	}
	if err := r.Run(t.Context()); !errors.Is(err, consumer.ErrRunning) {
		t.Fatalf("second Run = %v, want ErrRunning", err)
	}
}

// TestRunnerDrainDeadline: a consumer still draining at the Runner's
// deadline makes Run return ErrDrainTimeout naming it.
func TestRunnerDrainDeadline(t *testing.T) {
	t.Parallel()
	// The consumers wait for their handlers without limit: only the
	// Runner's deadline ends the wait.
	tb := setupRunner(t, consumer.Config{DrainTimeout: -1}, "orders", "payments")
	r, err := consumer.NewRunner(consumer.RunnerConfig{IgnoreSignals: true, DrainTimeout: 50 * time.Millisecond}, tb.consumers...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	tb.awaitHandlers(t)
	cancel()
	err = awaitRun(t, done)
	if !errors.Is(err, consumer.ErrDrainTimeout) || !strings.Contains(err.Error(), "still draining: orders, payments") {
		t.Fatalf("Run = %v, want ErrDrainTimeout naming both consumers", err)
	}
	close(tb.release)
	for _, c := range tb.consumers {
		if !waitStats(c, 10*time.Second, func(s consumer.Stats) bool { return s.Acked == 1 }) {
			t.Fatalf("a handler that finished after the deadline: %+v", c.Stats())
		}
	}
}

// TestRunnerFirstErrorStopsTheOthers: a consumer whose source closes under
// it stops; the Runner stops the others and returns that error.
func TestRunnerFirstErrorStopsTheOthers(t *testing.T) {
	t.Parallel()
	tb := setupRunner(t, consumer.Config{}, "orders", "payments", "refunds")
	close(tb.release) // handlers return at once
	r, err := consumer.NewRunner(consumer.RunnerConfig{IgnoreSignals: true}, tb.consumers...)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(t.Context()) }()
	tb.awaitHandlers(t)
	awaitProbe(t, r.Handler(), "/readyz", http.StatusOK)
	if err := tb.srcs[1].Close(); err != nil {
		t.Fatal(err)
	}
	err = awaitRun(t, done)
	if !errors.Is(err, adapters.ErrClosed) || !strings.Contains(err.Error(), `consumer "payments" stopped`) {
		t.Fatalf("Run = %v, want payments' ErrClosed", err)
	}
	if code, body := probe(t, r.Handler(), "/healthz"); code != http.StatusServiceUnavailable || body != "stopped\norders stopped\npayments stopped\nrefunds stopped\n" {
		t.Fatalf("/healthz after Run = %d %q", code, body)
	}
}

func TestNewRunnerRejects(t *testing.T) {
	t.Parallel()
	tb := setupRunner(t, consumer.Config{}, "orders")
	twin := setupRunner(t, consumer.Config{}, "orders")
	for _, tc := range []struct {
		cfg  consumer.RunnerConfig
		cs   []*consumer.Consumer
		want string
	}{
		{consumer.RunnerConfig{DrainTimeout: -time.Second}, tb.consumers, "RunnerConfig.DrainTimeout = -1s"},
		{consumer.RunnerConfig{}, nil, "no consumers"},
		{consumer.RunnerConfig{}, []*consumer.Consumer{tb.consumers[0], nil}, "consumer 1 is nil"},
		{consumer.RunnerConfig{}, append(tb.consumers, twin.consumers...), `two consumers are named "orders"`},
	} {
		t.Run(tc.want, func(t *testing.T) {
			r, err := consumer.NewRunner(tc.cfg, tc.cs...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewRunner = %v, %v; want an error saying %q", r, err, tc.want)
			}
		})
	}
}

// ExampleRunner runs two consumers with one lifecycle and serves their
// probes.
func ExampleRunner() {
	ctx := context.Background()
	b, _ := memory.New(memory.Config{})
	handle := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })
	var consumers []*consumer.Consumer
	for _, queue := range []string{"orders", "refunds"} {
		_ = b.CreateQueue(queue, memory.QueueConfig{})
		src, _ := b.QueueSource(queue)
		defer src.Close() // after Run returned
		c, err := consumer.New(src, handle, consumer.Config{Name: queue})
		if err != nil {
			fmt.Println(err)
			return
		}
		consumers = append(consumers, c)
	}
	r, err := consumer.NewRunner(consumer.RunnerConfig{DrainTimeout: 45 * time.Second}, consumers...)
	if err != nil {
		fmt.Println(err)
		return
	}
	// In a service: go http.ListenAndServe(":8081", r.Handler())
	probes := httptest.NewServer(r.Handler())
	defer probes.Close()

	runCtx, stop := context.WithTimeout(ctx, 100*time.Millisecond) // in a service: ctx, until SIGTERM
	defer stop()
	fmt.Println("run:", r.Run(runCtx))
	resp, _ := http.Get(probes.URL + "/healthz")
	resp.Body.Close()
	fmt.Println("healthz after Run:", resp.StatusCode)
	// Output:
	// run: <nil>
	// healthz after Run: 503
}
