package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
)

// TestStaleProbeTimerDoesNothing: a probe timer that fired but waited for
// the lock while the breaker closed and opened again must not start a probe
// beside the new timer's, nor drop the new timer; and no timer starts a
// second probe while one runs.
func TestStaleProbeTimerDoesNothing(t *testing.T) {
	t.Parallel()
	br, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := br.CreateQueue("q", memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	src, err := br.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	// A virtual clock that never moves: the timers only fire when the test
	// calls runProbe.
	clock := memory.NewVirtualClock(time.Time{})
	c, err := New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil }), Config{Clock: clock, Breaker: &Breaker{Threshold: 1}})
	if err != nil {
		t.Fatal(err)
	}
	held := &ackwise.Message{ID: "held"}
	c.mu.Lock()
	b := c.breaker
	b.open = true
	b.probeDelay = time.Hour // the clock never gets there
	b.held = []task{{msg: held}}
	b.scheduleProbeLocked(0) // the old timer: gen 1
	stale := b.probeGen
	b.stopProbe()            // the breaker closes: stopping fails, the timer fired already
	b.scheduleProbeLocked(0) // and opens again: the new timer
	current := b.probe
	c.mu.Unlock()
	defer current.Stop()

	runProbeWithin(t, c, stale)
	c.mu.Lock()
	if len(b.held) != 1 || b.probing != nil || b.probe != current {
		c.mu.Unlock()
		t.Fatalf("the stale timer acted: held %d, probing %v, new timer kept %v", len(b.held), b.probing, b.probe == current)
	}
	// A probe is running: the current timer does not start a second.
	b.probing = &ackwise.Message{ID: "probe"}
	gen := b.probeGen
	c.mu.Unlock()
	runProbeWithin(t, c, gen)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(b.held) != 1 || b.probing.ID != "probe" {
		t.Fatalf("a second probe started beside the running one: held %d, probing %s", len(b.held), b.probing.ID)
	}
}

// runProbeWithin runs c.breaker.runProbe(gen). Starting a probe queues its message
// for a worker, which blocks here (Run is not running): that is a failure.
func runProbeWithin(t *testing.T, c *Consumer, gen uint64) {
	t.Helper()
	done := make(chan struct{})
	go func() { c.breaker.runProbe(gen); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("runProbe started a probe: it is blocked queueing the held message")
	}
}
