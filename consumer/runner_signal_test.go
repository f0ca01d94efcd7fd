//go:build unix

package consumer_test

import (
	"context"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/ackwise/ackwise/consumer"
)

// TestRunnerStopsOnSIGTERM: SIGTERM to the process drains every consumer
// within the Runner's deadline: handlers running when it arrives finish,
// their messages are acked, and Run returns nil. (Not parallel: the signal
// goes to the whole test process, which only the Runner listens for.)
func TestRunnerStopsOnSIGTERM(t *testing.T) {
	tb := setupRunner(t, consumer.Config{}, "orders", "payments")
	r, err := consumer.NewRunner(consumer.RunnerConfig{DrainTimeout: 10 * time.Second}, tb.consumers...)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	// Handlers run: Run has called every consumer's Run, after it began to
	// listen for the signal.
	tb.awaitHandlers(t)
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	awaitProbe(t, r.Handler(), "/readyz", http.StatusServiceUnavailable)
	close(tb.release)
	if err := awaitRun(t, done); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	tb.requireAcked(t)
}
