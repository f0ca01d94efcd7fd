package kafka

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
)

// TestCrashMidBatchReplaysOnlyUnsettled kills (SIGKILL) a consumer that
// settled two thirds of a batch out of order; the next member replays the
// unsettled third and nothing else.
func TestCrashMidBatchReplaysOnlyUnsettled(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess crash test (-short)")
	}
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	cfg.Options = fastGroup
	const n = 100
	sink := openSink(t, cfg)
	publishN(t, sink, n, func(i int) string { return "k" + strconv.Itoa(i%13) })
	child, _ := startChild(t, childEnv+"=crash-consumer", "CRASH_N="+strconv.Itoa(n), "CRASH_BROKERS="+strings.Join(brokers, ","), "CRASH_TOPIC="+cfg.Topic, "CRASH_GROUP="+cfg.Group)
	kill9(t, child)
	sentinel := publishN(t, sink, 1, func(int) string { return "sentinel" })[0]
	src := openSource(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // the dead member's session must expire
	defer cancel()
	var replayed []int64
	buf := make([]*ackwise.Message, 16)
	for done := false; !done; {
		k, err := src.Receive(ctx, buf)
		if err != nil {
			t.Fatalf("receive after %v: %v", replayed, err)
		}
		for _, m := range buf[:k] {
			if m.Offset == n { // the sentinel, published after the crash
				if m.ID != sentinel.ID {
					t.Fatalf("offset %d is %s", n, m.ID)
				}
				done = true
				continue
			}
			replayed = append(replayed, m.Offset)
		}
	}
	var want []int64
	for o := int64(0); o < n; o += 3 {
		want = append(want, o)
	}
	if len(replayed) != len(want) {
		t.Fatalf("replayed %d records %v, want the %d unsettled %v", len(replayed), replayed, len(want), want)
	}
	for i := range want {
		if replayed[i] != want[i] {
			t.Fatalf("replayed %v, want %v", replayed, want)
		}
	}
}
