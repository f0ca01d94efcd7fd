package consumer

import (
	"testing"
	"time"
)

func TestPaceSwitchesWithHysteresis(t *testing.T) {
	t.Parallel()
	var p pace
	p.reset()
	mode := func() string { return paceNames[p.mode.Load()] }
	feed := func(per time.Duration, samples int) {
		for range samples {
			p.sample(per*flushEvery, flushEvery)
		}
	}
	if mode() != "single" {
		t.Fatalf("starts %s, want single", mode())
	}
	feed(3*time.Microsecond, 30)
	if mode() != "batch" {
		t.Fatalf("3µs messages: %s, want batch", mode())
	}
	feed(15*time.Microsecond, 50) // between fastBelow and slowAbove
	if mode() != "batch" {
		t.Fatalf("15µs after fast: %s, want batch (hysteresis)", mode())
	}
	feed(100*time.Nanosecond, 60)
	if mode() != "inline" {
		t.Fatalf("100ns messages: %s, want inline", mode())
	}
	feed(700*time.Nanosecond, 60) // between inlineBelow and inlineAbove
	if mode() != "inline" {
		t.Fatalf("700ns after 100ns: %s, want inline (hysteresis)", mode())
	}
	// One outlier, however long, is capped: it leaves inline but is not slow.
	p.sample(time.Second, 1)
	if mode() != "batch" {
		t.Fatalf("after one outlier: %s, want batch", mode())
	}
	p.sample(time.Second, 1)
	if mode() != "single" {
		t.Fatalf("after two outliers: %s, want single", mode())
	}
	feed(15*time.Microsecond, 50)
	if mode() != "single" {
		t.Fatalf("15µs after slow: %s, want single (hysteresis)", mode())
	}
	feed(200*time.Nanosecond, 60)
	if mode() != "inline" {
		t.Fatalf("200ns after slow: %s, want inline", mode())
	}
	p.fixed = true
	p.mode.Store(modeBatch)
	p.reset()
	p.sample(time.Second, 1)
	p.sample(time.Second, 1)
	if mode() != "batch" {
		t.Fatalf("pinned batch moved to %s", mode())
	}
}

// TestPaceSlowFallsBackToSingle: the stall watch's fallback puts a fast pace
// back to single at once.
func TestPaceSlowFallsBackToSingle(t *testing.T) {
	var p pace
	p.reset()
	for range 100 {
		p.sample(100*time.Nanosecond, 1)
	}
	if m := p.mode.Load(); m != modeInline {
		t.Fatalf("mode %d after fast samples, want inline", m)
	}
	p.slow()
	if m := p.mode.Load(); m != modeSingle {
		t.Fatalf("mode %d after slow, want single", m)
	}
}
