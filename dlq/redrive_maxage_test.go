package dlq_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/dlq"
)

// TestRedriveMaxAge: dead letters written longer ago than MaxAge, or at no
// known time, are left where they are and reported, also with Force; the
// others move. OnStart is told the backlog before the first receive.
func TestRedriveMaxAge(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	now := time.Now()
	for _, l := range []struct {
		id          string
		first, last time.Time
	}{
		{"fresh", now.Add(-2 * time.Minute), now.Add(-time.Minute)},
		{"old", now.Add(-3 * time.Hour), now.Add(-2 * time.Hour)},
		{"first-only", now.Add(-time.Minute), time.Time{}},
		{"undated", time.Time{}, time.Time{}},
	} {
		env := dlq.Envelope{Reason: dlq.ReasonPermanent, ErrorClass: "permanent", Source: tb.work, Partition: -1, Offset: -1, Attempts: 1, FirstFailure: l.first, LastFailure: l.last}
		memorytest.Publish(t, tb.b, tb.dead, &ackwise.Message{ID: l.id, Payload: []byte("p"), Headers: env.Apply(nil)})
	}
	backlog := -2
	var tooOld []string
	res, err := dlq.Redrive(t.Context(), tb.from, tb.to, dlq.RedriveOptions{
		Rate: dlq.RateUnlimited, IdleTimeout: quick, MaxAge: time.Hour, Force: true,
		OnStart: func(n int) {
			if backlog != -2 {
				t.Error("OnStart called twice")
			}
			backlog = n
		},
		OnMessage: func(msg *ackwise.Message, _ dlq.Envelope, a dlq.Action) {
			if backlog == -2 {
				t.Error("OnMessage before OnStart")
			}
			if a == dlq.ActionTooOld {
				tooOld = append(tooOld, msg.ID)
			}
		},
	})
	if err != nil || res.Moved != 2 || res.TooOld != 2 || res.Skipped != 0 || res.Backlog != 4 || backlog != 4 {
		t.Fatalf("result %+v, %v; OnStart(%d)", res, err, backlog)
	}
	if !equalSets(tooOld, []string{"old", "undated"}) {
		t.Fatalf("too old: %q", tooOld)
	}
	if got := tb.ids(t, tb.work); !equalSets(got, []string{"fresh", "first-only"}) {
		t.Fatalf("work queue holds %q", got)
	}
	tb.requireHeld(t, "old", "undated")

	if err := (dlq.RedriveOptions{MaxAge: -time.Second}).Validate(); err == nil || !strings.Contains(err.Error(), "MaxAge = -1s") {
		t.Fatalf("Validate(MaxAge -1s) = %v", err)
	}
}

func TestParseReason(t *testing.T) {
	t.Parallel()
	for _, r := range dlq.Reasons {
		if got, err := dlq.ParseReason(string(r)); err != nil || got != r {
			t.Errorf("ParseReason(%q) = %q, %v", r, got, err)
		}
	}
	if _, err := dlq.ParseReason("Permanent"); err == nil || !strings.Contains(err.Error(), `unknown reason "Permanent"`) {
		t.Errorf("ParseReason(Permanent) = %v", err)
	}
}
