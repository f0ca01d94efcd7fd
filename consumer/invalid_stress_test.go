package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// settleLog is a revokingSource that logs every settle call in one
// sequence, so that a test sees each message's fate and the order of fates.
type settleLog struct {
	*revokingSource
	mu     sync.Mutex
	events []settleEvent
	refuse map[*ackwise.Message]bool // dead letters refused until the receipt is lost
}

type settleEvent struct {
	msg  *ackwise.Message
	kind string
}

func (s *settleLog) log(m *ackwise.Message, kind string) {
	s.mu.Lock()
	s.events = append(s.events, settleEvent{m, kind})
	s.mu.Unlock()
}

func (s *settleLog) Ack(ctx context.Context, m *ackwise.Message) error {
	s.log(m, "ack")
	return s.fakeSource.Ack(ctx, m)
}

func (s *settleLog) Release(ctx context.Context, m *ackwise.Message) error {
	s.log(m, "release")
	return s.fakeSource.Release(ctx, m)
}

func (s *settleLog) DeadLetter(ctx context.Context, m *ackwise.Message, env dlq.Envelope) error {
	if s.refuse[m] && s.Valid(m) {
		return errors.New("dead-letter publish: refused")
	}
	s.log(m, "dead")
	return s.fakeSource.DeadLetter(ctx, m, env)
}

// Receipts lost at random while messages run, wait in place (retries,
// failed moves) and are held by an open breaker: every message gets exactly
// one fate (acked, dead-lettered or released), a key's messages get theirs
// in arrival order, nothing stays in flight and the breaker does not stay
// open with nothing to probe. 40 seeds (10 with -short).
func TestLostReceiptsAtRandom(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= shortScaled(40); seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 7))
			n, keys := 120, 1+rng.IntN(12)
			ms := msgs(n, keys)
			src := &settleLog{
				revokingSource: &revokingSource{fakeSource: newFakeSource(adapters.Capabilities{Ordered: true, Log: true}, ms...)},
				refuse:         map[*ackwise.Message]bool{},
			}
			fails := map[*ackwise.Message]int{}
			poison := map[*ackwise.Message]bool{}
			for _, m := range ms {
				switch r := rng.IntN(10); {
				case r < 4:
					fails[m] = 1 + rng.IntN(4)
				case r == 4:
					poison[m] = true
					src.refuse[m] = rng.IntN(2) == 0
				}
			}
			var mu sync.Mutex
			runs := map[*ackwise.Message]int{}
			busy := map[string]bool{}
			var overlap error
			h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
				mu.Lock()
				if busy[m.Key] && overlap == nil {
					overlap = fmt.Errorf("key %s: two messages at once", m.Key)
				}
				busy[m.Key] = true
				runs[m]++
				r := runs[m]
				mu.Unlock()
				time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
				mu.Lock()
				busy[m.Key] = false
				mu.Unlock()
				if poison[m] {
					return ackwise.Permanent(errors.New("bad"))
				}
				if r <= fails[m] {
					if rand.IntN(2) == 0 {
						return ackwise.RetryAfter(errors.New("429"), time.Duration(1+rand.IntN(20))*time.Millisecond)
					}
					return errors.New("503")
				}
				return nil
			})
			cfg := consumer.Config{
				Ordering: consumer.OrderKey, Concurrency: 1 + rng.IntN(4), MaxInFlight: 4 + rng.IntN(30),
				Retry: retry.Policy{MaxAttempts: 3, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond},
			}
			if rng.IntN(3) > 0 {
				cfg.Breaker = &consumer.Breaker{Threshold: 1 + rng.IntN(3), ProbeInterval: time.Millisecond, MaxProbeInterval: 4 * time.Millisecond}
			}
			c, err := consumer.New(src, h, cfg)
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, c)
			lrng := rand.New(rand.NewPCG(seed, 8))
			start := time.Now()
			for all := false; ; {
				src.mu.Lock()
				done := len(src.events) >= n
				src.mu.Unlock()
				if done {
					break
				}
				switch el := time.Since(start); {
				case el > 10*time.Second:
					t.Fatalf("stats %+v, %d fates: messages never settled nor released", c.Stats(), len(src.events))
				case el > 3*time.Second && !all:
					all = true
					src.revoke(ms...) // whatever still waits is lost now
				}
				time.Sleep(time.Duration(lrng.IntN(3)) * time.Millisecond)
				var lost []*ackwise.Message
				for range lrng.IntN(4) {
					lost = append(lost, ms[lrng.IntN(n)])
				}
				src.revoke(lost...)
			}
			if !waitStats(c, 5*time.Second, func(s consumer.Stats) bool { return s.InFlight == 0 && !s.Paused && s.Held == 0 }) {
				t.Fatalf("stats %+v: messages still in flight or the breaker open", c.Stats())
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if overlap != nil {
				t.Fatal(overlap)
			}
			src.mu.Lock()
			defer src.mu.Unlock()
			fate := map[*ackwise.Message]string{}
			last := map[string]int{} // key: index in ms of the last message given a fate
			index := map[*ackwise.Message]int{}
			for i, m := range ms {
				index[m] = i
			}
			for _, e := range src.events {
				if f, ok := fate[e.msg]; ok {
					t.Fatalf("%s: %s, then %s", e.msg.ID, f, e.kind)
				}
				fate[e.msg] = e.kind
				if i, ok := last[e.msg.Key]; ok && i > index[e.msg] {
					var tr []string
					for _, x := range src.events {
						if x.msg.Key == e.msg.Key {
							tr = append(tr, x.msg.ID+":"+x.kind)
						}
					}
					t.Fatalf("key %s: %s got its fate (%s) after %s (%s); key trace %v", e.msg.Key, e.msg.ID, e.kind, ms[i].ID, fate[ms[i]], tr)
				}
				last[e.msg.Key] = index[e.msg]
			}
			if len(fate) != n {
				t.Fatalf("%d fates for %d messages", len(fate), n)
			}
			s := c.Stats()
			if s.Acked+s.DeadLettered+s.Released+s.Retried+s.SettleFailed < uint64(n) || s.Released > uint64(len(src.released)) {
				t.Fatalf("stats %+v, %d released by the source", s, len(src.released))
			}
		})
	}
}
