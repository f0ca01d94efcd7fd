package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// TestFetchMaxBytesReachesClient: SourceConfig.FetchMaxBytes is documented
// to bound the records the source holds (it is franz-go's FetchMaxBytes), but
// it must be passed to the client to do so; so must
// SourceConfig.FetchMaxPartitionBytes.
func TestFetchMaxBytesReachesClient(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	cfg.FetchMaxBytes = 64 << 10
	cfg.FetchMaxPartitionBytes = 16 << 10
	src := openSource(t, cfg)
	if got, _ := src.Client().OptValue(kgo.FetchMaxBytes).(int32); got != cfg.FetchMaxBytes {
		t.Fatalf("client FetchMaxBytes = %d, want SourceConfig.FetchMaxBytes %d", got, cfg.FetchMaxBytes)
	}
	if got, _ := src.Client().OptValue(kgo.FetchMaxPartitionBytes).(int32); got != cfg.FetchMaxPartitionBytes {
		t.Fatalf("client FetchMaxPartitionBytes = %d, want SourceConfig.FetchMaxPartitionBytes %d", got, cfg.FetchMaxPartitionBytes)
	}
}

// TestShareSourceBoundsPoll: every record a share source polls is locked to
// it until settled (and accepted if the client polls again first), so a poll
// takes at most ShareConfig.PollBatch records, DefaultSharePollBatch when 0, and
// the client fetches only when the source polls (MaxConcurrentFetches 0),
// so that records do not wait in its buffer, locked with nobody renewing
// them. (franz-go can still grant one fetch while a poll returns, which is
// why the buffer itself is not checked here: see
// TestShareStaleBufferedRecordsNotDelivered.)
func TestShareSourceBoundsPoll(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		batch, records, want int
	}{
		{batch: 8, records: 40, want: 8},
		{batch: 0, records: DefaultSharePollBatch + 40, want: DefaultSharePollBatch},
	} {
		brokers := newCluster(t)
		cfg := testConfig(t, brokers, 1)
		cfg.PollBatch = tc.batch
		sink := openSink(t, cfg)
		publishN(t, sink, tc.records, func(i int) string { return "k" })
		src := openShare(t, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		buf := make([]*ackwise.Message, 2)
		n, err := src.Receive(ctx, buf)
		if err != nil || n == 0 {
			cancel()
			t.Fatalf("PollBatch %d: Receive = %d, %v", tc.batch, n, err)
		}
		src.mu.Lock()
		taken := src.outstanding
		src.mu.Unlock()
		if taken > tc.want {
			t.Errorf("PollBatch %d: one poll took %d records: want at most %d", tc.batch, taken, tc.want)
		}
		if got, _ := src.Client().OptValue(kgo.MaxConcurrentFetches).(int); got != 0 {
			t.Errorf("PollBatch %d: the client's MaxConcurrentFetches is %d, want 0 (no fetching ahead)", tc.batch, got)
		}
		for _, m := range buf[:n] {
			if err := src.Ack(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
	}
}
