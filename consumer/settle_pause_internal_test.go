package consumer

import (
	"testing"
	"time"
)

// The intake pauses on new settle failures only while nothing else is
// settled, doubling from 10ms up to 5s; a message settled in between ends
// the pause, so that a failing message does not hold back healthy ones.
func TestSettlePause(t *testing.T) {
	var p settlePause
	ms := time.Millisecond
	for i, step := range []struct {
		failures, settled uint64
		want              time.Duration
	}{
		{0, 0, 0},       // nothing failed
		{1, 0, 10 * ms}, // failures alone
		{2, 0, 20 * ms}, // again, nothing settled since
		{2, 0, 0},       // no new failure
		{5, 0, 40 * ms}, // several at once count as one round
		{6, 3, 0},       // messages settled since: no pause
		{7, 3, 10 * ms}, // failures alone again: from the start
		{7, 9, 0},       // settled, no new failure
		{8, 9, 0},       // settled between the failures: no pause
		{9, 9, 10 * ms}, // nothing settled since the last failures
	} {
		if got := p.next(step.failures, step.settled); got != step.want {
			t.Fatalf("step %d (%d failures, %d settled): pause %v, want %v", i, step.failures, step.settled, got, step.want)
		}
	}
	var last time.Duration
	for range 20 {
		last = p.next(p.seen+1, 9)
	}
	if last != 5*time.Second {
		t.Fatalf("pause after many rounds of failures alone: %v, want the cap, 5s", last)
	}
}
