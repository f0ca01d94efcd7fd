package kafka

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/consumer"
)

// TestRevokeWhileMoveWaits: the partition of a record whose dead letter
// waits to be tried again is revoked. The revoke waits for the partition's
// records in flight; the engine hands the record back as soon as the source
// says it is no longer this member's, so the revoke ends at once, not at
// the move's next try, and the record comes back from the committed offset
// (its handler run a second time). The engine's clock is virtual and
// stands still: the move's next try never comes, so an engine that waited
// for it would hold the revoke for the whole RevokeTimeout (10s); the
// revoke must take less than half of that, a bound far from what load
// adds to a revoke that does not wait.
func TestRevokeWhileMoveWaits(t *testing.T) {
	t.Parallel()
	var o *outage
	revoked := make(chan time.Duration, 4)
	// Eager: a rebalance revokes every partition, and the only member gets
	// them back. The wrapper times the source's revoke.
	opts := append(slices.Clone(fastGroup), kgo.Balancers(kgo.RoundRobinBalancer()),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, r map[string][]int32) {
			start := time.Now()
			o.src.onRevoked(ctx, cl, r)
			revoked <- time.Since(start)
		}))
	o = newOutageWith(t, opts, func(cfg SourceConfig) string { return cfg.Topics()[1] })
	o.runTimed(t, o.badFailsPermanently(), consumer.Config{Concurrency: 4, Clock: memory.NewVirtualClock(time.Time{})})
	o.log.awaitFailedTries(t, 1) // the next try waits on the virtual clock
	o.awaitOthers(t)
	o.src.Client().ForceRebalance()
	var took time.Duration
	select {
	case took = <-revoked:
	case <-time.After(15 * time.Second):
		t.Fatal("no revoke within 15s")
	}
	t.Logf("revoke took %v", took)
	if took > DefaultRevokeTimeout/2 {
		t.Errorf("the revoke took %v: it waited for the move's next try (until its RevokeTimeout, %v)", took, DefaultRevokeTimeout)
	}
	// Redelivered from the committed offset, still failing: the handler
	// runs again and its dead letter fails again.
	if b := o.log.next(t); b.o != consumer.SettleFailed || !b.valid {
		t.Fatalf("outcome %v (valid %v) after the revoke, want the redelivery's failed dead letter", b.o, b.valid)
	}
	if n := o.runs("bad"); n != 2 {
		t.Errorf("bad record handled %d times, want twice (once per delivery)", n)
	}
}
