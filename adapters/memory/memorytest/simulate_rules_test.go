package memorytest_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/retry"
)

// TestSimulateAppliesTheEngineRules: with no faults, each error class is
// settled as the engine settles it.
func TestSimulateAppliesTheEngineRules(t *testing.T) {
	t.Parallel()
	errDown := errors.New("down")
	for _, mode := range []memorytest.SimMode{memorytest.SimQueue, memorytest.SimLog} {
		sim := memorytest.Simulation[struct{}]{
			Workload: []*ackwise.Message{
				memorytest.Msg("ok", "a", ""),
				memorytest.Msg("permanent", "b", ""),
				memorytest.Msg("discard", "c", ""),
				memorytest.Msg("transient", "d", ""),
				memorytest.Msg("rate-limited", "e", ""),
				memorytest.Msg("panics", "f", ""),
			},
			Setup: func(env *memorytest.SimEnv, _ struct{}) ackwise.Handler {
				return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
					switch msg.ID {
					case "permanent":
						return ackwise.Permanent(errDown)
					case "discard":
						return ackwise.Discard(errDown)
					case "transient":
						return errDown
					case "rate-limited":
						if msg.Attempt == 1 {
							return ackwise.RetryAfter(errDown, 7*time.Second)
						}
					case "panics":
						panic("boom")
					}
					return nil
				})
			},
			Check:  func(*memorytest.SimEnv, struct{}) error { return nil },
			Mode:   mode,
			Faults: memorytest.FaultRates{Off: true},
			Retry:  retry.Policy{MaxAttempts: 3, InitialInterval: time.Second, Jitter: retry.NoJitter},
		}
		var outcomes map[string]memorytest.SimMessage
		sim.Check = func(env *memorytest.SimEnv, _ struct{}) error {
			outcomes = map[string]memorytest.SimMessage{}
			for _, m := range env.Messages() {
				outcomes[m.ID] = m
			}
			return nil
		}
		tr, err := sim.Trace(1)
		if err != nil {
			t.Fatal(err)
		}
		if len(tr.Faults) != 0 {
			t.Fatalf("%s: faults fired with Off: %v", mode, tr.Faults)
		}
		for id, want := range map[string]struct {
			outcome    memorytest.SimOutcome
			deliveries int
		}{
			"ok":           {memorytest.SimAcked, 1},
			"permanent":    {memorytest.SimDeadLettered, 1},
			"discard":      {memorytest.SimDiscarded, 1},
			"transient":    {memorytest.SimDeadLettered, 3}, // MaxAttempts
			"rate-limited": {memorytest.SimAcked, 2},
			"panics":       {memorytest.SimDeadLettered, 1},
		} {
			if got := outcomes[id]; got.Outcome != want.outcome || got.Deliveries != want.deliveries {
				t.Errorf("%s: %s: %s after %d deliveries, want %s after %d\n%s", mode, id, got.Outcome, got.Deliveries, want.outcome, want.deliveries, tr.Timeline())
			}
		}
		timeline := tr.Timeline()
		for _, want := range []string{"redelivered in 7s", "partition", "redelivered in 1s", "redelivered in 2s"} {
			if mode == memorytest.SimLog && strings.HasPrefix(want, "redelivered in ") {
				want = "waits " + strings.TrimPrefix(want, "redelivered in ")
			}
			if want == "partition" && mode == memorytest.SimQueue {
				continue
			}
			if !strings.Contains(timeline, want) {
				t.Errorf("%s: the timeline lacks %q:\n%s", mode, want, timeline)
			}
		}
	}
}

// TestSimulateReportsASeedThatDoesNotFinish: a message retried forever
// fails the seed instead of hanging the test.
func TestSimulateReportsASeedThatDoesNotFinish(t *testing.T) {
	t.Parallel()
	msg := simulateFailure(t, memorytest.Simulation[struct{}]{
		Workload: orders(),
		Setup: func(*memorytest.SimEnv, struct{}) ackwise.Handler {
			return ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return errors.New("never") })
		},
		Check: func(*memorytest.SimEnv, struct{}) error { return nil },
		Retry: retry.Policy{MaxAttempts: retry.Unlimited},
	})
	if !strings.Contains(msg, "did not finish within 1500 deliveries") {
		t.Fatalf("got %q", msg)
	}
}

func TestSimulationTraceRefusesAnInvalidSimulation(t *testing.T) {
	t.Parallel()
	setup := func(*memorytest.SimEnv, struct{}) ackwise.Handler { return nil }
	check := func(*memorytest.SimEnv, struct{}) error { return nil }
	for _, tc := range []struct {
		sim  memorytest.Simulation[struct{}]
		want string
	}{
		{memorytest.Simulation[struct{}]{Workload: orders(), Check: check}, "Setup is nil"},
		{memorytest.Simulation[struct{}]{Workload: orders(), Setup: setup}, "Check is nil"},
		{memorytest.Simulation[struct{}]{Setup: setup, Check: check}, "neither Workload nor Generate"},
		{memorytest.Simulation[struct{}]{Workload: orders(), Setup: setup, Check: check, Mode: 7}, "Mode = 7"},
		{memorytest.Simulation[struct{}]{Workload: orders(), Setup: setup, Check: check, Faults: memorytest.FaultRates{Duplicate: 1.5}}, "FaultRates.duplicate = 1.5"},
		{memorytest.Simulation[struct{}]{Workload: orders(), Setup: setup, Check: check, Retry: retry.Policy{MaxAttempts: -2}}, "MaxAttempts = -2"},
	} {
		if _, err := tc.sim.Trace(1); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Trace: error %v, want one containing %q", err, tc.want)
		}
	}
	// A nil handler is the seed's failure.
	tr, err := memorytest.Simulation[struct{}]{Workload: orders(), Setup: setup, Check: check}.Trace(1)
	if err != nil || tr.Violation == nil || !strings.Contains(tr.Violation.Error(), "nil handler") {
		t.Errorf("Trace with a nil handler: %v, violation %v", err, tr.Violation)
	}
}

// outbox is the durable state of the publish scenario: the orders
// confirmed.
type outbox struct{ confirmed map[string]bool }

// TestSimulateFindsAnIgnoredPublishFailure: a handler that publishes its
// event and ignores the error loses the event when the publish fails;
// returning the error retries it. The workload is drawn per seed.
func TestSimulateFindsAnIgnoredPublishFailure(t *testing.T) {
	t.Parallel()
	sim := memorytest.Simulation[*outbox]{
		Generate: func(r *rand.Rand) []*ackwise.Message {
			msgs := make([]*ackwise.Message, 5+r.IntN(20))
			for i := range msgs {
				msgs[i] = memorytest.Msg(fmt.Sprintf("o%d", i), fmt.Sprintf("cust-%d", r.IntN(4)), "")
			}
			return msgs
		},
		Init: func(*memorytest.SimEnv) *outbox { return &outbox{confirmed: map[string]bool{}} },
		Setup: func(env *memorytest.SimEnv, o *outbox) ackwise.Handler {
			return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
				o.confirmed[msg.ID] = true
				_ = env.Publish(ctx, memorytest.Msg(msg.ID+"-confirmed", msg.Key, "")) // the bug: the error is dropped
				return nil
			})
		},
		Check: func(env *memorytest.SimEnv, o *outbox) error {
			published := map[string]bool{}
			for _, m := range env.Published() {
				published[strings.TrimSuffix(m.ID, "-confirmed")] = true
			}
			for _, m := range env.Messages() {
				if o.confirmed[m.ID] && !published[m.ID] {
					return fmt.Errorf("%s confirmed, its event never published", m.ID)
				}
			}
			return nil
		},
		Faults: memorytest.FaultRates{PublishFailure: 0.05, Duplicate: 0.05},
	}
	requireFound(t, sim, 1, "publish-failure")
}

// TestSimulateEndsDespiteATicker: a handler whose process flushes on a
// timer that re-arms itself forever still lets each seed end, after the
// flush of the last message ran.
func TestSimulateEndsDespiteATicker(t *testing.T) {
	t.Parallel()
	type batcher struct{ flushed map[string]bool }
	memorytest.Simulate(t, memorytest.Simulation[*batcher]{
		Workload: orders(),
		Init:     func(*memorytest.SimEnv) *batcher { return &batcher{flushed: map[string]bool{}} },
		Setup: func(env *memorytest.SimEnv, b *batcher) ackwise.Handler {
			var pending []string // lost in a crash
			var tick func()
			tick = func() {
				for _, id := range pending {
					b.flushed[id] = true
				}
				pending = nil
				env.Clock().AfterFunc(100*time.Millisecond, tick)
			}
			env.Clock().AfterFunc(100*time.Millisecond, tick)
			return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
				pending = append(pending, msg.ID)
				return nil
			})
		},
		Check: func(env *memorytest.SimEnv, b *batcher) error {
			// A crash may lose a pending batch (the ack-first bug): only
			// that the ticker ran is checked here.
			if len(b.flushed) == 0 {
				return errors.New("nothing was flushed: the ticker never ran")
			}
			return nil
		},
		Seeds: 20,
	})
}
