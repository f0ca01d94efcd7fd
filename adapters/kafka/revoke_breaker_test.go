package kafka

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
)

// TestRevokeWhileBreakerHolds: member A's dependency is down, its breaker
// open and holding every record it received, with the next probe an hour
// away. Member B joins; the revoke of A's partitions waits for their
// records in flight. The engine hands the held records back as soon as the
// source says they are no longer A's, so the revoke ends at once, not at
// RevokeTimeout, and B gets the records.
func TestRevokeWhileBreakerHolds(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 2)
	const revokeTimeout = 4 * time.Second
	cfg.RevokeTimeout = revokeTimeout
	// Eager: B's join revokes every partition of A, whichever partitions
	// A's held records are on.
	cfg.Options = append(slices.Clone(fastGroup), kgo.Balancers(kgo.RoundRobinBalancer()))
	const n = 10
	publishN(t, openSink(t, cfg), n, func(i int) string { return "k" + strconv.Itoa(i) })

	var srcA atomic.Pointer[Source]
	revoked := make(chan time.Duration, 1)
	cfgA := cfg
	// The wrapper times A's revokes (the first with partitions to revoke).
	cfgA.testOptions = append(slices.Clone(cfg.testOptions), kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, r map[string][]int32) {
		s := srcA.Load()
		if s == nil {
			return // before A's first assignment: nothing to revoke
		}
		start := time.Now()
		s.onRevoked(ctx, cl, r)
		if len(r) > 0 {
			select {
			case revoked <- time.Since(start):
			default:
			}
		}
	}))
	a := openSource(t, cfgA)
	srcA.Store(a)
	down := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		return errors.New("503: dependency down")
	})
	c := runConsumer(t, a, down, consumer.Config{
		Concurrency: 4,
		Breaker:     &consumer.Breaker{Threshold: 1, ProbeInterval: time.Hour},
	})
	// Polled: the engine has no event for a message held.
	deadline := time.Now().Add(15 * time.Second)
	s := c.Stats()
	for !s.Paused || s.Held == 0 || s.Held != s.InFlight {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: want the breaker open, holding every record in flight", s)
		}
		time.Sleep(time.Millisecond)
		s = c.Stats()
	}
	held := s.Held

	b := openSource(t, cfg)
	bgot := make(chan *ackwise.Message, 1)
	go func() {
		bctx, bcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer bcancel()
		buf := make([]*ackwise.Message, 1)
		if k, err := b.Receive(bctx, buf); k == 1 && err == nil {
			bgot <- buf[0]
		}
		close(bgot)
	}()
	var took time.Duration
	select {
	case took = <-revoked:
	case <-time.After(30 * time.Second):
		t.Fatal("no revoke within 30s of B joining")
	}
	t.Logf("revoke with %d records held by the open breaker took %v (RevokeTimeout %v)", held, took, revokeTimeout)
	if took > revokeTimeout/2 {
		t.Errorf("the revoke took %v: it waited for the records the breaker held", took)
	}
	if _, ok := <-bgot; !ok {
		t.Fatal("B received nothing")
	}
	// Observed just after the source got the release the revoke waited for.
	deadline = time.Now().Add(5 * time.Second)
	for s = c.Stats(); s.Released < uint64(held) && time.Now().Before(deadline); s = c.Stats() {
		time.Sleep(time.Millisecond)
	}
	if s.Released < uint64(held) || s.Acked+s.Retried+s.DeadLettered != 0 {
		t.Errorf("stats %+v: want the %d held records released, none settled", s, held)
	}
}
