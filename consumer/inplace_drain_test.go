package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// A message waiting in place for its retry when Run stops goes back to the
// broker observed once, as Retried, as when the stop comes between the
// retry's decision and its wait (TestRetryRefusedAtStopObservedOnce) and as
// a message waiting at the broker: the broker's redelivery is its retry.
// Before, it was observed as Retried and then, at the drain, as Released.
func TestInPlaceWaitAtStopObservedOnce(t *testing.T) {
	t.Parallel()
	const wait = 7 * time.Minute
	src := newFakeSource(adapters.Capabilities{})
	scheduled := make(chan struct{}, 1)
	obs := &outcomeLog{}
	c, err := consumer.New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		return errors.New("transient")
	}), consumer.Config{
		Observer:  obs,
		RetryMode: consumer.RetryInPlace,
		Retry:     retry.Policy{InitialInterval: wait, Jitter: retry.NoJitter},
		Clock:     waitClock{wait: wait, scheduled: scheduled},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	src.push(&ackwise.Message{ID: "m", Source: "q", Partition: -1, Offset: -1, Attempt: 1})
	select {
	case <-scheduled: // the retry waits in place
	case <-time.After(10 * time.Second):
		t.Fatalf("the retry's wait was not scheduled; stats %+v", c.Stats())
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	requireRetriedOnce(t, c, obs, src)
}

// requireRetriedOnce checks, after Run returned, that the one message of src
// was observed once, as Retried, and released once, back to the broker,
// with nothing left in flight.
func requireRetriedOnce(t *testing.T, c *consumer.Consumer, obs *outcomeLog, src *fakeSource) {
	t.Helper()
	s := c.Stats()
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.all) != 1 || obs.all[0] != consumer.Retried || s.Retried != 1 || s.Released != 0 {
		t.Errorf("outcomes observed %v, stats Retried %d Released %d: want Retried once, nothing else", obs.all, s.Retried, s.Released)
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if len(src.released) != 1 || s.InFlight != 0 {
		t.Errorf("the message was released %d times, %d in flight: want once, back to the broker, none in flight", len(src.released), s.InFlight)
	}
}

// waitClock is the system clock that signals scheduled when a wait of
// exactly wait is scheduled (the engine's in-place retry wait).
type waitClock struct {
	wait      time.Duration
	scheduled chan struct{}
}

func (c waitClock) Now() time.Time { return time.Now() }

func (c waitClock) AfterFunc(d time.Duration, f func()) ackwise.Timer {
	t := time.AfterFunc(d, f)
	if d == c.wait {
		select {
		case c.scheduled <- struct{}{}:
		default:
		}
	}
	return t
}

// A message retried in place whose next attempt then fails while the
// breaker is open is held by the breaker: that attempt has no outcome yet,
// so the drain releases it observed as Released, as every message the
// breaker holds.
func TestInPlaceRetryThenBreakerHeldReleasedAtStop(t *testing.T) {
	t.Parallel()
	const wait, probe = 7 * time.Minute, time.Hour
	src := newFakeSource(adapters.Capabilities{})
	clk := &manualClock{wait: wait, probe: probe, scheduled: make(chan struct{}, 1), probed: make(chan struct{}, 1), fire: make(chan struct{})}
	secondRun := make(chan struct{}, 1)
	obs := &outcomeLog{}
	c, err := consumer.New(src, ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		if m.ID == "a" && m.Attempt == 2 {
			secondRun <- struct{}{}
		}
		return errors.New("dependency down")
	}), consumer.Config{
		Observer:  obs,
		RetryMode: consumer.RetryInPlace,
		Retry:     retry.Policy{InitialInterval: wait, Jitter: retry.NoJitter},
		Breaker:   &consumer.Breaker{Threshold: 2, ProbeInterval: probe},
		Clock:     clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	await := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out waiting for %s; stats %+v", what, c.Stats())
		}
	}
	src.push(&ackwise.Message{ID: "a", Key: "a", Source: "q", Partition: -1, Offset: -1, Attempt: 1})
	await(clk.scheduled, "a's retry to wait in place")
	src.push(&ackwise.Message{ID: "b", Key: "b", Source: "q", Partition: -1, Offset: -1, Attempt: 1})
	await(clk.probed, "the breaker to open on b") // b is held
	close(clk.fire)                               // a's wait is over
	await(secondRun, "a's second attempt")
	deadline := time.Now().Add(10 * time.Second)
	for c.Stats().Held != 2 { // no event marks a message held
		if time.Now().After(deadline) {
			t.Fatalf("a not held by the breaker; stats %+v", c.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	s := c.Stats()
	if s.Retried != 1 || s.Released != 2 {
		t.Errorf("stats Retried %d Released %d: want a retried once, then a and b released from the breaker", s.Retried, s.Released)
	}
}

// manualClock is the system clock but for the waits of exactly wait, which
// run when fire is closed (signalling scheduled), and of exactly probe,
// which never run (signalling probed).
type manualClock struct {
	wait, probe       time.Duration
	scheduled, probed chan struct{}
	fire              chan struct{}
}

func (c *manualClock) Now() time.Time { return time.Now() }

func (c *manualClock) AfterFunc(d time.Duration, f func()) ackwise.Timer {
	switch d {
	case c.wait:
		t := &manualTimer{stop: make(chan struct{})}
		go func() {
			select {
			case <-c.fire:
				if t.stopped.CompareAndSwap(false, true) {
					f()
				}
			case <-t.stop:
			}
		}()
		signal(c.scheduled)
		return t
	case c.probe:
		signal(c.probed)
		return &manualTimer{stop: make(chan struct{})}
	}
	return time.AfterFunc(d, f)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

type manualTimer struct {
	stopped atomic.Bool
	stop    chan struct{}
}

func (t *manualTimer) Stop() bool {
	if !t.stopped.CompareAndSwap(false, true) {
		return false
	}
	close(t.stop)
	return true
}
