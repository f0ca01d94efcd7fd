package main

import (
	"strings"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/dlq"
)

// TestInspectLineQuotesTheEventID: inspect prints one line per message,
// also when the event ID (set by whatever producer, not by ackwise) holds a
// newline or spaces. The ID was printed as it came, so such an ID split the
// line or forged a second one.
func TestInspectLineQuotesTheEventID(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	forged := "ev-1\nev-9 reason=permanent class=permanent"
	tb.add(t, forged, dlq.ReasonPermanent, ackwise.ClassPermanent, "boom")
	memorytest.Publish(t, tb.b, tb.dead, &ackwise.Message{ID: "ev-2 x\n", Payload: []byte("p")}) // no envelope

	code, out, errOut := ackwiseRun(t, "dlq", "inspect", "mem://"+tb.dead, "--idle", "300ms")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	got := lines(out)
	if len(got) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(got), out)
	}
	for _, l := range got {
		if !strings.HasPrefix(l, `"ev-`) {
			t.Errorf("line %q does not start with the quoted event ID", l)
		}
	}
	tb.requireUntouched(t, 2)
}
