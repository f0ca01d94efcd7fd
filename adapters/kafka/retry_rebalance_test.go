package kafka

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// TestRetryPartitionsAcrossRebalances: records that fail twice walk the
// retry tiers while members join and leave the group, so retry partitions
// paused for held records not yet due are revoked with those records held
// (seen with instrumentation while writing the test) and picked up by
// their next owner. Every record is eventually handled successfully at its
// third attempt, none is dead-lettered, and no handler acks a record after
// its member lost the partition. It covers an untested path: no other test
// rebalances a group with retry tiers.
func TestRetryPartitionsAcrossRebalances(t *testing.T) {
	if testing.Short() {
		t.Skip("rebalance test (-short)")
	}
	t.Parallel()
	brokers := newCluster(t)
	tiers := []time.Duration{300 * time.Millisecond, 700 * time.Millisecond}
	cfg := testConfig(t, brokers, 4, tiers...)
	cfg.Options = fastGroup
	cfg.RevokeTimeout = 2 * time.Second
	const n = 200
	publishN(t, openSink(t, cfg), n, func(i int) string { return "k" + strconv.Itoa(i%13) })
	var late atomic.Int64
	seen := newTally()
	var failMu sync.Mutex
	failures := map[string][]int{}
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		i, _ := strconv.Atoi(m.ID[len("ev-"):])
		if i%2 == 0 && m.Attempt < 3 {
			failMu.Lock()
			failures[m.ID] = append(failures[m.ID], m.Attempt)
			failMu.Unlock()
			return errors.New("not yet")
		}
		seen.add(m.ID)
		return nil
	})
	ccfg := memberConfig
	ccfg.RetryMode = consumer.RetryBroker
	ccfg.Retry = retry.Policy{MaxAttempts: 10}
	start := func(handled *atomic.Int64) func() {
		h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
			handled.Add(1)
			return h.Handle(ctx, m)
		})
		return startMember(t, cfg, h, &late, ccfg).stop
	}
	count := func(k int) func(map[string]int) bool {
		return func(s map[string]int) bool { return len(s) >= k }
	}
	// A owns everything; B takes some partitions, paused retry
	// partitions among them, and hands them back to A when it leaves; C
	// takes over from A.
	var byA, byB atomic.Int64
	stopA := start(&byA)
	seen.wait(t, "A's first records", 20*time.Second, count(n/4))
	stopB := start(&byB)
	seen.wait(t, "B's first records", 20*time.Second, func(map[string]int) bool { return byB.Load() >= 20 })
	stopB()
	a := byA.Load()
	seen.wait(t, "A's records after B left", 20*time.Second, func(map[string]int) bool { return byA.Load() >= a+20 })
	start(new(atomic.Int64))
	stopA()
	seen.wait(t, "every record", 30*time.Second, count(n))
	if l := late.Load(); l != 0 {
		t.Errorf("%d records were handled after their member lost the partition", l)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	if dls := readAll(rctx, t, brokers, cfg.Topic+".dlq"); len(dls) != 0 {
		t.Errorf("%d records dead-lettered", len(dls))
	}
	failMu.Lock()
	defer failMu.Unlock()
	for i := 0; i < n; i += 2 {
		id := "ev-" + strconv.Itoa(i)
		if len(failures[id]) < 2 {
			t.Errorf("%s failed at attempts %v, want 1 and 2", id, failures[id])
		}
	}
}
