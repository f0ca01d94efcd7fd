package producer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/retry"
)

// throttledSink fails its first publishes with errs, in order, then
// succeeds, and records when each publish came.
type throttledSink struct {
	errs []error
	at   []time.Time
}

func (s *throttledSink) Publish(context.Context, ...*ackwise.Message) error {
	s.at = append(s.at, time.Now())
	if len(s.errs) == 0 {
		return nil
	}
	err := s.errs[0]
	s.errs = s.errs[1:]
	return err
}

func (s *throttledSink) Close() error { return nil }

// A sink that asks for a delay (ackwise.RetryAfter) gets at least that
// delay before the next try, not the policy's shorter backoff.
func TestRetryAfterIsWaited(t *testing.T) {
	t.Parallel()
	const asked = 80 * time.Millisecond
	sink := &throttledSink{errs: []error{ackwise.RetryAfter(errors.New("throttled"), asked)}}
	p, err := producer.New(sink, producer.Config{Retry: retry.Policy{InitialInterval: time.Millisecond, MaxInterval: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(context.Background(), &ackwise.Message{ID: "e1"}); err != nil {
		t.Fatal(err)
	}
	if len(sink.at) != 2 {
		t.Fatalf("%d publishes, want 2", len(sink.at))
	}
	if gap := sink.at[1].Sub(sink.at[0]); gap < asked {
		t.Fatalf("retried after %v, want at least the %v the sink asked for", gap, asked)
	}
}

// A delay longer than the policy's MaxInterval is not waited out inside
// Publish: the error comes back at once, with its delay.
func TestRetryAfterBeyondMaxIntervalReturns(t *testing.T) {
	t.Parallel()
	sink := &throttledSink{errs: []error{ackwise.RetryAfter(errors.New("throttled"), time.Hour)}}
	p, err := producer.New(sink, producer.Config{Retry: retry.Policy{InitialInterval: time.Millisecond, MaxInterval: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	// The bound only keeps a broken Publish from hanging the test.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	err = p.Publish(ctx, &ackwise.Message{ID: "e1"})
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Publish took %v: it waited for the delay instead of returning", took)
	}
	if err == nil || !strings.Contains(err.Error(), "after 1 attempt(s)") {
		t.Fatalf("Publish = %v, want a failure after one attempt", err)
	}
	if d, ok := ackwise.RetryAfterOf(err); !ok || d != time.Hour {
		t.Fatalf("RetryAfterOf(err) = %v, %v; want 1h, true", d, ok)
	}
}

// An InitialInterval above the retry package's default MaxInterval (10m) is
// accepted by the producer, whose default MaxInterval follows InitialInterval.
func TestLongInitialIntervalAccepted(t *testing.T) {
	t.Parallel()
	if _, err := producer.New(&throttledSink{}, producer.Config{Retry: retry.Policy{InitialInterval: 20 * time.Minute}}); err != nil {
		t.Fatalf("New = %v", err)
	}
}
