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

// slowAcks is a source whose acks take a while, as a broker's round trip
// does.
type slowAcks struct{ *fakeSource }

func (s slowAcks) Ack(ctx context.Context, m *ackwise.Message) error {
	time.Sleep(3 * time.Millisecond) // the broker's round trip, not a wait for a signal
	return s.fakeSource.Ack(ctx, m)
}

// TestStallWatchQuietWhileBatchesFlow: batches of quick handlers whose
// acks take longer than the stall watch's period, as an SQS consumer's do
// (a DeleteMessageBatch round trip), do not wake the watch: it looks at a
// worker only while the worker runs a chunk's handlers, not while
// messages are merely in flight. (Ticking every 2 ms while anything was in
// flight, it woke at least once per round here.)
func TestStallWatchQuietWhileBatchesFlow(t *testing.T) {
	t.Parallel()
	const rounds, per = 40, 16 // 8 a worker: no flush inside a chunk
	src := newFakeSource(adapters.Capabilities{Delay: true})
	all := msgs(rounds*per, rounds*per)
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })
	c := newPaced(t, slowAcks{src}, h, consumer.Config{Concurrency: 2, MaxInFlight: per, ReceiveBatch: per}, "batch")
	stop := run(t, c)
	defer stop()
	for r := range rounds {
		src.push(all[r*per : (r+1)*per]...)
		if !src.waitSettled((r+1)*per, 10*time.Second) {
			t.Fatalf("round %d not settled: %+v", r, c.Stats())
		}
	}
	// A worker descheduled for 2 ms in the middle of a chunk (a loaded
	// machine) wakes it once: allow a few.
	if w := consumer.StallWatchWakes(c); w > rounds/4 {
		t.Errorf("the stall watch woke %d times in %d rounds of quick handlers", w, rounds)
	}
}
