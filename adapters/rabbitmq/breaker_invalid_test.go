package rabbitmq

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// invalidSeen wraps a Source and sends the time of each call of the
// engine's invalidation hook: when the source said its deliveries stopped
// being Valid.
type invalidSeen struct {
	*Source
	at chan time.Time
}

func (s invalidSeen) OnInvalid(f func()) {
	s.Source.OnInvalid(func() {
		select {
		case s.at <- time.Now():
		default:
		}
		f()
	})
}

// Extensions declares the wrapper's OnInvalid: the embedded Source's would
// reach the source around it.
func (s invalidSeen) Extensions() adapters.Extensions {
	return adapters.Extensions{Invalidator: s}
}

// genOutcome is an outcome, the message it was for, the channel generation
// that delivered it and when it was observed.
type genOutcome struct {
	id  string
	o   consumer.Outcome
	gen uint64
	at  time.Time
}

type genLog chan genOutcome

func (l genLog) Observe(m *ackwise.Message, o consumer.Outcome, _ time.Duration) {
	l <- genOutcome{m.ID, o, m.Handle.(*receipt).s.gen, time.Now()}
}

// TestDeadChannelEndsBreakerHold: the dependency is down, the breaker open
// and holding every delivery in flight, its probe an hour away. The
// dependency comes back, but nothing tells the engine but a probe. The
// broker closes the consuming connection: the source says its deliveries
// are no longer Valid, and the engine hands the held ones back at once
// (Released), the breaker, left holding nothing, closes and consumption
// resumes: the broker's redeliveries arrive on the new channel and each is
// acked once, nothing left in flight or in the queue.
func TestDeadChannelEndsBreakerHold(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	const n = 6
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName + "-sink"})
	for i := range n {
		id := "m" + strconv.Itoa(i)
		if err := sink.Publish(ctxT(t), &ackwise.Message{ID: id, Key: "k" + strconv.Itoa(i), Payload: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	src := invalidSeen{newSource(t, cfg), make(chan time.Time, 16)}
	var down atomic.Bool
	down.Store(true)
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		if down.Load() {
			return errors.New("503: dependency down")
		}
		return nil
	})
	log := make(genLog, 16*n)
	cons, err := consumer.New(src, h, consumer.Config{
		Concurrency: 2,
		// Every slot taken by the held deliveries: the receive loop waits
		// for the breaker, not in a Receive begun before it opened (that
		// one would go on, and its redeliveries would close the breaker
		// by succeeding).
		MaxInFlight: n,
		Breaker:     &consumer.Breaker{Threshold: 3, ProbeInterval: time.Hour},
		// The failures before the breaker opens wait in place briefly; none
		// runs out of attempts.
		RetryMode: consumer.RetryInPlace,
		Retry:     retry.Policy{MaxAttempts: 20, InitialInterval: 5 * time.Millisecond, MaxInterval: 5 * time.Millisecond},
		Observer:  log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- cons.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-runErr; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	t.Cleanup(stop)

	// Polled: the engine has no event for a message held.
	pollStats := func(what string, ok func(consumer.Stats) bool) consumer.Stats {
		t.Helper()
		deadline := time.Now().Add(testTimeout)
		s := cons.Stats()
		for !ok(s) {
			if time.Now().After(deadline) {
				t.Fatalf("stats %+v: %s", s, what)
			}
			time.Sleep(time.Millisecond)
			s = cons.Stats()
		}
		return s
	}
	pollStats("want the breaker open, holding every delivery in flight", func(s consumer.Stats) bool {
		return s.Paused && s.Held == n && s.InFlight == n
	})
	// The dependency is back; only the probe, an hour away, could tell.
	down.Store(false)

	var firstGen uint64
	for len(log) > 0 {
		o := <-log
		if o.o != consumer.Retried {
			t.Fatalf("outcome %v for %s while the dependency was down, want retried (in place) or held", o.o, o.id)
		}
		firstGen = o.gen
	}
	if firstGen == 0 {
		t.Fatal("no failure observed before the breaker opened")
	}
	closeStart := time.Now()
	if k := closeConnections(t, cfg.ConnectionName+`"`); k != 1 {
		t.Fatalf("closed %d connections, want the consumer's", k)
	}
	closeTook := time.Since(closeStart)
	var invalidAt time.Time
	select {
	case invalidAt = <-src.at:
	case <-time.After(testTimeout):
		t.Fatal("the source never said its deliveries stopped being Valid")
	}

	released := map[string]int{}
	acked := map[string]int{}
	var lastRelease, lastAck time.Time
	timeout := time.After(testTimeout)
	for len(released) < n || len(acked) < n {
		select {
		case o := <-log:
			switch {
			case o.o == consumer.Released && o.gen == firstGen:
				released[o.id]++
				lastRelease = o.at
			case o.o == consumer.Acked && o.gen > firstGen:
				acked[o.id]++
				lastAck = o.at
			default:
				t.Fatalf("outcome %v for %s on channel %d (the held ones were on %d), want released there, acked on the next", o.o, o.id, o.gen, firstGen)
			}
		case <-timeout:
			t.Fatalf("released %v, acked %v: want all %d held deliveries handed back and acked once redelivered (the probe is an hour away)", released, acked, n)
		}
	}
	handBack := lastRelease.Sub(invalidAt)
	t.Logf("server-side close (rabbitmqctl) took %v; %d held deliveries released %v after the source's invalidation, their redeliveries acked %v after it",
		closeTook, n, handBack, lastAck.Sub(invalidAt))
	if handBack > 5*time.Second {
		t.Errorf("the held deliveries were handed back %v after the channel died: not at once", handBack)
	}
	s := pollStats("want nothing in flight, the breaker closed", func(s consumer.Stats) bool {
		return s.InFlight == 0 && !s.Paused && s.Held == 0
	})
	if s.Acked != n || s.Released != n || s.Received != 2*n || s.BreakerTrips != 1 || s.DeadLettered+s.Discarded+s.SettleFailed != 0 {
		t.Errorf("stats %+v: want %d received twice, released once, acked once, one breaker trip", s, n)
	}
	stop()
	src.Close()
	for len(log) > 0 {
		o := <-log
		t.Errorf("outcome %v for %s after every message was acked", o.o, o.id)
	}
	for id, k := range acked {
		if k != 1 || released[id] != 1 {
			t.Errorf("%s: released %d times, acked %d times; want once each", id, released[id], k)
		}
	}
	if d := queueDepth(t, c, cfg.Queue); d != 0 {
		t.Errorf("%d messages back in the queue after Close: an ack was lost", d)
	}
}
