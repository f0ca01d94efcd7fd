package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/consumer"
)

// TestBreakerProbeHonoursRetryAfter: a rate-limited failure that opens the
// breaker, and a probe that is rate-limited again, ask the dependency to be
// left alone for a minute (ackwise.RetryAfter). The next probe must not run
// sooner, whatever ProbeInterval (1s here, doubling) says.
//
// The source is a memory log (no lease, so no heartbeat timer): the probe
// timer is the engine's only timer on the virtual clock, and
// VirtualClock.Pending tells deterministically whether it fired.
func TestBreakerProbeHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	br, clock := memorytest.NewBroker(t)
	topic := memorytest.UniqueName(t)
	if err := br.CreateTopic(topic, memory.TopicConfig{}); err != nil {
		t.Fatal(err)
	}
	src, err := br.JoinGroup(topic, "g")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	var calls atomic.Int64
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		if calls.Add(1) <= 2 {
			return ackwise.RetryAfter(errors.New("429 Too Many Requests"), time.Minute)
		}
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{
		Clock:   clock,
		Breaker: &consumer.Breaker{Threshold: 1, ProbeInterval: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	memorytest.Publish(t, br, topic, memorytest.Msg("m", "k", "x"))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for probe := 1; probe <= 2; probe++ {
		// The failure (the first run, then the first probe) armed the
		// probe timer.
		if err := clock.WaitForTimers(ctx, 1); err != nil {
			t.Fatalf("probe %d: no probe timer armed: %v (stats %+v)", probe, err, c.Stats())
		}
		clock.Advance(time.Minute - time.Millisecond)
		if n := clock.Pending(); n != 1 {
			t.Fatalf("probe %d: the probe timer fired before the minute RetryAfter asked for (pending timers %d, handler calls %d)", probe, n, calls.Load())
		}
		clock.Advance(time.Millisecond)
	}
	memorytest.WaitForAcked(t, br, topic, "m")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if st, n := c.Stats(), calls.Load(); n != 3 || st.Acked != 1 || st.Retried != 0 || st.DeadLettered != 0 || st.BreakerTrips != 1 {
		t.Fatalf("calls %d, stats %+v: want 3 calls (run, 2 probes), acked once, tripped once", n, st)
	}
}
