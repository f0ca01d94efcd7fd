package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
)

// Messages held by an open breaker are handed back as soon as the source
// says their receipts are lost (adapters.Invalidator), not at the next
// probe, with the messages of their keys queued behind them, each observed
// as Released; the messages still this consumer's stay held. A breaker left
// with nothing to probe with closes, and consumption resumes. A receipt
// lost while the handler runs, before its message is held, or while a
// probe runs, is not missed.
func TestLostReceiptEndsBreakerHold(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		n    int
		// revoke, called by the handler on each failing run (runs is
		// that message's run count), loses receipts; nil: the test does,
		// in two steps, once the first run of every key is held.
		revoke func(src *revokingSource, ms []*ackwise.Message, m *ackwise.Message, runs int)
		runs   int // failing handler runs in all
	}{
		{name: "held", n: 6, runs: 3},
		{name: "lost while running", n: 1, runs: 1, revoke: func(src *revokingSource, _ []*ackwise.Message, m *ackwise.Message, _ int) {
			src.revoke(m)
		}},
		{name: "lost while probing", n: 2, runs: 3, revoke: func(src *revokingSource, ms []*ackwise.Message, _ *ackwise.Message, runs int) {
			if runs == 2 { // the probe
				src.revoke(ms...)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ms := msgs(tc.n, 3) // "held": two messages of each of 3 keys
			src := &revokingSource{fakeSource: newFakeSource(adapters.Capabilities{Ordered: true, Log: true}, ms...)}
			clock := memory.NewVirtualClock(time.Time{})
			var mu sync.Mutex
			runs := map[*ackwise.Message]int{}
			failed := 0
			h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
				if m.ID == "ok" {
					return nil
				}
				mu.Lock()
				runs[m]++
				r := runs[m]
				failed++
				mu.Unlock()
				if tc.revoke != nil {
					tc.revoke(src, ms, m, r)
				}
				return errors.New("503: dependency down")
			})
			c, err := consumer.New(src, h, consumer.Config{
				Ordering: consumer.OrderKey, Concurrency: 4, Clock: clock,
				Breaker: &consumer.Breaker{Threshold: 1, ProbeInterval: time.Second},
			})
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, c)
			switch tc.name {
			case "held":
				if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.Held == 3 }) {
					t.Fatalf("stats %+v: want the first message of each key held", c.Stats())
				}
				src.revoke(ms[0], ms[3]) // key k0: held e0, e3 queued behind it
				if !src.waitReleased(2, 5*time.Second) {
					t.Fatalf("released %v after k0's receipts were lost, want e0 and e3", src.released)
				}
				if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.InFlight == 4 }) {
					t.Fatalf("stats %+v: k0's messages still in flight", c.Stats())
				}
				if s := c.Stats(); !s.Paused || s.Held != 2 {
					t.Fatalf("stats %+v: want the breaker open, holding the two messages still valid", s)
				}
				src.revoke(ms...)
			case "lost while probing":
				if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.Held == 2 }) {
					t.Fatalf("stats %+v: want both messages held", c.Stats())
				}
				clock.Advance(time.Second) // the probe
			}
			if !src.waitReleased(tc.n, 5*time.Second) {
				t.Fatalf("released %v after the receipts were lost, want all %d messages", src.released, tc.n)
			}
			if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.InFlight == 0 && !s.Paused }) {
				t.Fatalf("stats %+v: the breaker is still open, or messages in flight", c.Stats())
			}
			// Consumption resumed: a new message is handled and acked.
			src.push(&ackwise.Message{ID: "ok", Key: "k9", Source: "orders", Partition: -1, Offset: -1})
			if !src.waitSettled(1, 5*time.Second) {
				t.Fatalf("stats %+v: the message received after the breaker closed was not acked", c.Stats())
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			s := c.Stats()
			mu.Lock()
			defer mu.Unlock()
			if s.Released != uint64(tc.n) || s.Acked != 1 || s.Retried+s.DeadLettered+s.Discarded+s.SettleFailed != 0 || failed != tc.runs {
				t.Fatalf("stats %+v, %d failing runs: want each message released once, unrun behind its key, and %d failing runs", s, failed, tc.runs)
			}
			if tc.name == "held" {
				src.mu.Lock()
				defer src.mu.Unlock()
				if src.released[0] != ms[0] || src.released[1] != ms[3] {
					t.Fatalf("released %v first, want e0, then e3 behind it", src.released[:2])
				}
			}
		})
	}
}

// Held messages whose receipts were lost without the source telling (no
// Invalidator: an SQS lease that ran out while the breaker held the
// message) are all handed back at the first probe, not one a probe
// interval, and the breaker, left with nothing to probe with, closes. The
// clock advances by one probe interval only: one message a probe would
// leave three held.
func TestSilentlyLostReceiptsHandedBackAtOneProbe(t *testing.T) {
	t.Parallel()
	ms := msgs(4, 4)
	src := newFakeSource(adapters.Capabilities{}, ms...)
	clock := memory.NewVirtualClock(time.Time{})
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		return errors.New("503: dependency down")
	})
	c, err := consumer.New(src, h, consumer.Config{
		Concurrency: 4, Clock: clock, RetryMode: consumer.RetryInPlace,
		Breaker: &consumer.Breaker{Threshold: 1, ProbeInterval: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, c)
	if !waitStats(c, 10*time.Second, func(s consumer.Stats) bool { return s.Held == 4 }) {
		t.Fatalf("stats %+v: want all four messages held", c.Stats())
	}
	for _, m := range ms {
		src.lose(m) // no OnInvalid: the engine is not told
	}
	clock.Advance(time.Second) // one probe
	if !src.waitReleased(4, 10*time.Second) {
		t.Fatalf("released %v after one probe, want all four", src.released)
	}
	if !waitStats(c, 10*time.Second, func(s consumer.Stats) bool { return s.InFlight == 0 && !s.Paused }) {
		t.Fatalf("stats %+v: the breaker is still open, or messages in flight", c.Stats())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
