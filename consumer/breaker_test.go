package consumer_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

var errDown = errors.New("payment gateway: 503 Service Unavailable")

type outageResult struct {
	published, ok, dead uint64
	trips               int
	elapsed             time.Duration // virtual time until everything settled
}

// simulateOutage runs the engine on the memory broker under a virtual clock:
// messages arrive at rate per second for 10 minutes, during which the
// dependency fails every call; then it answers again. The retry policy is the
// one from the seed article: 5 attempts, a fixed 30 s between them. It
// returns when every message is acked or dead-lettered.
func simulateOutage(t *testing.T, rate int, breaker *consumer.Breaker) outageResult {
	t.Helper()
	const (
		outage = 10 * time.Minute
		limit  = 40 * time.Minute
	)
	// Virtual time moves in steps of 100 arrivals (100ms at 1,000 msgs/s):
	// the run's cost is mostly per step (the engine settles after each),
	// so a lower rate takes fewer, longer steps, still well under the
	// breaker's probe interval (5s) and the retry tier (30s).
	step := 100 * time.Second / time.Duration(rate)
	clock := memory.NewVirtualClock(time.Time{})
	br, err := memory.New(memory.Config{Clock: clock, DisableHistory: true})
	if err != nil {
		t.Fatal(err)
	}
	// The lease outlasts the outage: this simulation advances virtual time
	// faster than the engine's heartbeat goroutine is scheduled, and lease
	// extension is not what it measures (TestHeartbeatKeepsLease is).
	if err := br.CreateQueue("payments", memory.QueueConfig{Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	src, err := br.QueueSource("payments")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	start := clock.Now()
	back := start.Add(outage)
	var ok atomic.Uint64
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		if clock.Now().Before(back) {
			return errDown
		}
		ok.Add(1)
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{
		Concurrency: 8,
		MaxInFlight: 256,
		Clock:       clock,
		Retry:       retry.Policy{MaxAttempts: 5, Tiers: []time.Duration{30 * time.Second}},
		Breaker:     breaker,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	perStep := rate * int(step) / int(time.Second)
	var published uint64
	batch := make([]*ackwise.Message, perStep)
	for clock.Now().Sub(start) < limit {
		if clock.Now().Before(back) {
			for i := range batch {
				published++
				batch[i] = &ackwise.Message{ID: "pay-" + strconv.FormatUint(published, 10), Key: "cust-" + strconv.FormatUint(published%5000, 10)}
			}
			if err := br.Publish(ctx, "payments", batch...); err != nil {
				t.Fatal(err)
			}
		}
		clock.Advance(step)
		waitIdle(t, c, br, clock)
		st := c.Stats()
		if !clock.Now().Before(back) && st.Acked+st.DeadLettered == published {
			return outageResult{published: published, ok: ok.Load(), dead: st.DeadLettered, trips: st.BreakerTrips, elapsed: clock.Now().Sub(start)}
		}
	}
	st := c.Stats()
	t.Fatalf("after %v of virtual time: %d published, %d acked, %d dead-lettered, %d in flight", limit, published, st.Acked, st.DeadLettered, st.InFlight)
	return outageResult{}
}

// waitIdle waits until the engine has done everything it can at the current
// virtual time: nothing ready that it could receive, nothing running, its
// timers armed. There
// is no single event for "nothing left to do", so it polls the counters
// (briefly, with a deadline).
func waitIdle(t *testing.T, c *consumer.Consumer, br *memory.Broker, clock *memory.VirtualClock) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		cs := c.Stats()
		ms, err := br.Stats("payments")
		if err != nil {
			t.Fatal(err)
		}
		// The engine's timers must be armed again too: the lease heartbeat
		// always, the breaker's probe while it is open.
		timers := 1
		if cs.Paused {
			timers = 2
		}
		if cs.InFlight == cs.Held && ms.InFlight == cs.Held && (ms.Ready == 0 || cs.Paused) && clock.Pending() >= timers {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine never went idle: consumer %+v broker %+v", cs, ms)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// outageRate is the simulation's arrival rate: 1,000 msgs/s at full scale,
// 100 under the race detector (about tenfold slower) and with -short (the
// offline unit run, bound to finish in minutes). The assertions scale with
// the rate; `make test` runs the full scale after its -race run.
func outageRate() int {
	if raceEnabled || testing.Short() {
		return 100
	}
	return 1000
}

// TestOutageWithoutBreakerDeadLettersTheWindow is the failure the breaker
// exists for: with retries alone, everything that arrived more than the
// retry span (4 × 30 s) before the dependency came back is dead-lettered.
func TestOutageWithoutBreakerDeadLettersTheWindow(t *testing.T) {
	rate := outageRate()
	r := simulateOutage(t, rate, nil)
	t.Logf("rate %d/s: published %d, dead-lettered %d (%.0f%%), acked %d", rate, r.published, r.dead, 100*float64(r.dead)/float64(r.published), r.ok)
	if want := uint64(rate * 450 * 9 / 10); r.dead < want {
		t.Fatalf("dead-lettered %d, want most of the window (≥ %d)", r.dead, want)
	}
	if r.ok+r.dead != r.published {
		t.Fatalf("acked %d + dead %d != published %d", r.ok, r.dead, r.published)
	}
}

// TestOutageWithBreakerDeadLettersNothing is the acceptance test of the
// breaker: the same outage, and not one good message is dead-lettered; all
// are handled once the dependency is back.
func TestOutageWithBreakerDeadLettersNothing(t *testing.T) {
	rate := outageRate()
	r := simulateOutage(t, rate, &consumer.Breaker{})
	t.Logf("rate %d/s: published %d, dead-lettered %d, acked %d, breaker trips %d, all settled after %v", rate, r.published, r.dead, r.ok, r.trips, r.elapsed)
	if r.dead != 0 {
		t.Fatalf("dead-lettered %d good messages during the outage", r.dead)
	}
	if r.ok != r.published {
		t.Fatalf("handled %d of %d after recovery", r.ok, r.published)
	}
	if r.trips < 1 {
		t.Fatal("the breaker never opened")
	}
}

// TestBreakerLetsALonePoisonMessageDeadLetter: one message failing while the
// others succeed is not an outage.
func TestBreakerLetsALonePoisonMessageDeadLetter(t *testing.T) {
	t.Parallel()
	clock := memory.NewVirtualClock(time.Time{})
	br, err := memory.New(memory.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	src, err := br.QueueSource("q")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == "poison" {
			return errDown
		}
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{
		Clock:   clock,
		Retry:   retry.Policy{MaxAttempts: 4, Tiers: []time.Duration{30 * time.Second}},
		Breaker: &consumer.Breaker{Threshold: 3},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for i := range 40 {
		id := "ok-" + strconv.Itoa(i)
		if i == 5 {
			id = "poison"
		}
		if err := br.Publish(ctx, "q", &ackwise.Message{ID: id, Key: id}); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		waitIdleQueue(t, c, br, "q")
		clock.Advance(30 * time.Second)
	}
	waitIdleQueue(t, c, br, "q")
	st := c.Stats()
	if st.DeadLettered != 1 || st.Acked != 39 || st.BreakerTrips != 0 {
		t.Fatalf("stats %+v: want the poison message dead-lettered, 39 acked, no trip", st)
	}
}

func waitIdleQueue(t *testing.T, c *consumer.Consumer, br *memory.Broker, q string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		cs := c.Stats()
		ms, _ := br.Stats(q)
		if cs.InFlight == 0 && ms.InFlight == 0 && ms.Ready == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never idle: %+v %+v", cs, ms)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// TestHeartbeatKeepsLease: a handler that runs for five minutes on a queue
// with a 30 s lease keeps its message; it is delivered once and acked once.
func TestHeartbeatKeepsLease(t *testing.T) {
	t.Parallel()
	clock, br, src := leasedQueue(t)
	started := make(chan struct{})
	finish := make(chan struct{})
	var runs atomic.Int64
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		if runs.Add(1) == 1 {
			close(started)
		}
		<-finish
		return nil
	})
	c, err := consumer.New(src, h, consumer.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := br.Publish(ctx, "q", &ackwise.Message{ID: "slow"}); err != nil {
		t.Fatal(err)
	}
	<-started
	// The heartbeat is the engine's only timer here: wait for it to be armed
	// before each step, so virtual time never outruns it.
	for range 60 {
		if err := clock.WaitForTimers(ctx, 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(5 * time.Second)
	}
	close(finish)
	waitIdleQueue(t, c, br, "q")
	if st := c.Stats(); st.Acked != 1 || st.SettleFailed != 0 || runs.Load() != 1 {
		t.Fatalf("stats %+v, runs %d: want one run, acked once", st, runs.Load())
	}
}
