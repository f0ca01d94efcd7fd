package adaptertest

import (
	"context"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// RedriveRun runs dlq.Redrive from from to to once, as an adapter's redrive
// tests do, and fails t if the run returns an error or moves one event ID
// twice. It returns the run's result, the event IDs it moved and how many
// dead letters it left at the redrive limit (dlq.ActionRedriveLimit).
// opts.OnMessage is replaced. It does not close from or to.
func RedriveRun(ctx context.Context, t testing.TB, from dlq.RedriveSource, to dlq.RedriveSink, opts dlq.RedriveOptions) (dlq.RedriveResult, map[string]bool, int) {
	t.Helper()
	moved := map[string]bool{}
	limited := 0
	// Redrive calls OnMessage from the goroutine that called it.
	opts.OnMessage = func(m *ackwise.Message, _ dlq.Envelope, a dlq.Action) {
		switch a {
		case dlq.ActionMoved:
			if moved[m.ID] {
				t.Errorf("%s moved twice in one run", m.ID)
			}
			moved[m.ID] = true
		case dlq.ActionRedriveLimit:
			limited++
		}
	}
	res, err := dlq.Redrive(ctx, from, to, opts)
	if err != nil {
		t.Fatalf("redrive: %+v: %v", res, err)
	}
	return res, moved, limited
}
