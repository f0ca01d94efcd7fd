package kafka

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// TestRevokeWaitsForRewind: a Release rewinds the partition with
// SetOffsets after checking that this member still owns it. Before, the
// partition could be revoked and assigned to this member again between the
// check and the SetOffsets; the SetOffsets then landed on the new
// assignment and skipped the records the revoke left unsettled below the
// released one (handlers that outlived RevokeTimeout): they were never
// delivered again. Now a revoke waits for a rewind in progress, so its
// SetOffsets lands on the old assignment, and the new one starts from the
// committed offset.
func TestRevokeWaitsForRewind(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	// Eager: a rebalance revokes every partition, and the only member
	// gets its partition back.
	cfg.Options = append(slices.Clone(fastGroup), kgo.Balancers(kgo.RoundRobinBalancer()))
	cfg.RevokeTimeout = -1 // a revoke does not wait for running handlers
	cfg.CommitInterval = time.Hour
	publishN(t, openSink(t, cfg), 10, func(i int) string { return "k" + strconv.Itoa(i) })
	src := openSource(t, cfg)
	msgs := receiveN(t, src, 10)
	ctx := context.Background()
	// 0-4 and 7 stay unsettled, as if their handlers still ran; 5 and 6
	// are acked; 8 is released.
	for _, i := range []int{5, 6} {
		if err := src.Ack(ctx, msgs[i]); err != nil {
			t.Fatal(err)
		}
	}
	checked, proceed, revoking := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var checkOnce, revokeOnce sync.Once
	src.testRewindChecked = func() {
		checkOnce.Do(func() {
			close(checked)
			<-proceed
		})
	}
	src.testRevoking = func() { revokeOnce.Do(func() { close(revoking) }) }
	released := make(chan error, 1)
	go func() { released <- src.Release(ctx, msgs[8]) }()
	select {
	case <-checked:
	case <-time.After(10 * time.Second):
		t.Fatal("the release did not rewind")
	}
	src.Client().ForceRebalance()
	select {
	case <-revoking:
	case <-time.After(10 * time.Second):
		close(proceed)
		t.Fatal("no revoke after ForceRebalance")
	}
	// The revoke has begun; while the rewind is between its check and
	// its SetOffsets, the partition must stay owned. Without the fix the
	// revoke marks it revoking within microseconds.
	window := time.NewTimer(300 * time.Millisecond)
	for wait := true; wait; {
		if !src.Valid(msgs[0]) {
			close(proceed)
			t.Fatal("the revoke went ahead while a rewind was between its ownership check and SetOffsets")
		}
		select {
		case <-window.C:
			wait = false
		case <-time.After(5 * time.Millisecond):
		}
	}
	close(proceed)
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	// The partition comes back; everything unsettled is delivered again,
	// from the committed offset: nothing skipped.
	want := map[int64]bool{0: true, 1: true, 2: true, 3: true, 4: true, 7: true, 8: true, 9: true}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	got := map[int64]bool{}
	for len(got) < len(want) {
		buf := make([]*ackwise.Message, 16)
		n, err := src.Receive(rctx, buf)
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		for _, m := range buf[:n] {
			if !want[m.Offset] {
				t.Fatalf("offset %d delivered again; it was acked", m.Offset)
			}
			got[m.Offset] = true
		}
	}
}
