package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// TestFetchMaxBytesReachesClient: Config.FetchMaxBytes is documented
// to bound the records the source holds (it is franz-go's FetchMaxBytes), but
// it must be passed to the client to do so; so must
// Config.FetchMaxPartitionBytes.
func TestFetchMaxBytesReachesClient(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	cfg.FetchMaxBytes = 64 << 10
	cfg.FetchMaxPartitionBytes = 16 << 10
	src := openSource(t, cfg)
	if got, _ := src.Client().OptValue(kgo.FetchMaxBytes).(int32); got != cfg.FetchMaxBytes {
		t.Fatalf("client FetchMaxBytes = %d, want Config.FetchMaxBytes %d", got, cfg.FetchMaxBytes)
	}
	if got, _ := src.Client().OptValue(kgo.FetchMaxPartitionBytes).(int32); got != cfg.FetchMaxPartitionBytes {
		t.Fatalf("client FetchMaxPartitionBytes = %d, want Config.FetchMaxPartitionBytes %d", got, cfg.FetchMaxPartitionBytes)
	}
}

// TestShareSourceBoundsPoll: a share source takes at most 4×len(buf)
// records per poll (every record taken is acquired, its lock running, and
// accepted when the client polls again). With PollBatch 0, now the
// default, min(PollBatch, 4*len(buf)) is 0, which franz-go reads as "no
// limit": the whole fetch is acquired at once.
func TestShareSourceBoundsPoll(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	sink := openSink(t, cfg)
	publishN(t, sink, 40, func(i int) string { return "k" })
	src := openShare(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	buf := make([]*ackwise.Message, 2)
	n, err := src.Receive(ctx, buf)
	if err != nil || n == 0 {
		t.Fatalf("Receive = %d, %v", n, err)
	}
	src.mu.Lock()
	taken := src.outstanding
	src.mu.Unlock()
	if taken > 4*len(buf) {
		t.Fatalf("one poll took %d records for a buffer of %d: want at most %d", taken, len(buf), 4*len(buf))
	}
	for _, m := range buf[:n] {
		if err := src.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
}
