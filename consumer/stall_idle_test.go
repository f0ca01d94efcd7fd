package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
)

// TestStallWatchParksWhenIdle: with nothing in flight the stall watch stops
// ticking (an idle consumer costs no wake-ups every 2ms), and messages that
// come in later wake it: a message of a fast batch that then blocks still
// has the rest of its batch spread to the other workers. Idle again, it
// parks again.
func TestStallWatchParksWhenIdle(t *testing.T) {
	t.Parallel()
	const n = 40
	src := newFakeSource(adapters.Capabilities{Delay: true})
	started, release := make(chan struct{}), make(chan struct{})
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == "e0" {
			close(started)
			<-release
		}
		return nil
	})
	c := newPaced(t, src, h, consumer.Config{Concurrency: 2, MaxInFlight: n, ReceiveBatch: n}, "batch")
	stop := run(t, c)
	defer stop()
	waitParked := func(when string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !consumer.StallWatchParked(c) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the stall watch is still ticking with nothing in flight: %+v", when, c.Stats())
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitParked("before any message")
	src.push(msgs(n, n)...)
	<-started
	if !src.waitSettled(n-1, 5*time.Second) {
		t.Fatalf("the other messages of e0's batch were held back while it blocks (the parked stall watch did not wake): %+v", c.Stats())
	}
	close(release)
	if !src.waitSettled(n, 5*time.Second) {
		t.Fatalf("not all settled: %+v", c.Stats())
	}
	waitParked("after the messages settled")
}
