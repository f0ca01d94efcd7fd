package kafka

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// TestTransactSessionExactlyOnce transforms records in transactions; the
// first attempt at one batch fails and is aborted. A read_committed reader
// sees every output exactly once; a read_uncommitted one also sees the
// aborted attempt's outputs.
func TestTransactSessionExactlyOnce(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound for a broken session only
	defer cancel()
	out := outTopic(t, cfg, 2)
	const n = 20
	in := publishN(t, openSink(t, cfg), n, func(i int) string { return "k" + string(rune('a'+i%5)) })
	sess := openTxn(ctx, t, cfg)
	var failedOnce, calls atomic.Int64
	fn := func(_ context.Context, m *ackwise.Message, emit func(Output)) error {
		calls.Add(1)
		emit(Output{Topic: out, Key: m.Key, Payload: bytes.ToUpper(append([]byte("out-"), m.Payload...)), ID: m.ID})
		if m.ID == in[n/2].ID && failedOnce.Add(1) == 1 {
			return errors.New("transient failure mid-batch")
		}
		return nil
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sess.Run(runCtx, fn) }()

	// Wait until the input offsets are committed (by the transaction):
	// polling the broker, which has no commit notification.
	adm := kadm.NewClient(sess.sess.Client())
	for {
		offs, err := adm.FetchOffsets(ctx, cfg.Group)
		if err == nil {
			var sum int64
			offs.Each(func(o kadm.OffsetResponse) { sum += o.At })
			if sum == n {
				break
			}
		}
		select {
		case <-ctx.Done():
			t.Fatal("input offsets never committed")
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if failedOnce.Load() < 1 || calls.Load() <= n {
		t.Fatalf("no aborted attempt happened (failures %d, calls %d)", failedOnce.Load(), calls.Load())
	}
	committedRecs := readIsolated(ctx, t, brokers, out, kgo.ReadCommitted())
	seen := map[string]int{}
	for _, r := range committedRecs {
		seen[recordMessage(r).ID]++
	}
	for _, m := range in {
		if seen[m.ID] != 1 {
			t.Errorf("read_committed sees %s %d times, want exactly once", m.ID, seen[m.ID])
		}
	}
	if len(committedRecs) != n {
		t.Errorf("read_committed sees %d outputs, want %d", len(committedRecs), n)
	}
	if all := readIsolated(ctx, t, brokers, out, kgo.ReadUncommitted()); len(all) <= n {
		t.Errorf("read_uncommitted sees %d outputs: the aborted attempt wrote nothing, so the test proved nothing", len(all))
	}
}

// readIsolated reads topic to its end with the given isolation level,
// outside any group. It keeps the transaction markers to know where the end
// is: a read_committed reader is never handed an aborted record, and a
// marker takes an offset, so "a record at end-1" cannot tell it was read
// through. Markers are handed to the client under both levels (aborted
// transactions' markers too), so each partition is read through once one
// with offset end-1 arrives. Waits as long as ctx allows (no window of its
// own: on a busy machine a fetch can take seconds), and fails the test if
// the end is not reached. It returns the data records only.
func readIsolated(ctx context.Context, t *testing.T, brokers []string, topic string, iso kgo.IsolationLevel) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(iso), kgo.KeepControlRecords())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	var out []*kgo.Record
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %s: %v (still waiting for the ends %v)", topic, err, want)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsControl() {
				out = append(out, r)
			}
			if end, ok := want[r.Partition]; ok && r.Offset+1 >= end {
				delete(want, r.Partition)
			}
		})
	}
	return out
}

// TestTransactSessionPausesAfterFailedBatch: a batch whose transform fails
// is consumed again, but after a growing pause, not at once: before, a
// transform failing for ever on one record spun the session (begin, poll,
// abort, hundreds of times a second, a warning logged each time).
func TestTransactSessionPausesAfterFailedBatch(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
	sess := openTxn(ctx, t, cfg)
	var calls atomic.Int64
	second := make(chan struct{})
	fn := func(context.Context, *ackwise.Message, func(Output)) error {
		if calls.Add(1) == 2 {
			close(second)
		}
		return errors.New("fails for ever")
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sess.Run(runCtx, fn) }()
	select {
	case <-second: // the failed batch came back: it is retried
	case <-ctx.Done():
		t.Fatalf("the failed batch was not consumed again (%d calls)", calls.Load())
	}
	// A window of one second: pauses of 100ms, 200ms, 400ms, ... (±50%)
	// fit at most a few more attempts in it; no pause fits hundreds.
	from := calls.Load()
	time.Sleep(time.Second)
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if n := calls.Load() - from; n > 6 {
		t.Fatalf("%d attempts at a failing batch within a second: want a growing pause between them", n)
	}
}

// TestTransactSessionReturnsFatalFetchError: a fetch error retrying will not
// cure (the user may join the group and describe the topic, not read it)
// ends Run with that error, as it ends Source.Receive. Before, Run logged it
// at Warn (the default Logger discards) and polled again for ever.
func TestTransactSessionReturnsFatalFetchError(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := unreadableTopic(ctx, t)
	sess := openTxn(ctx, t, cfg)
	runCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	err := sess.Run(runCtx, func(context.Context, *ackwise.Message, func(Output)) error { return nil })
	if err == nil || runCtx.Err() != nil {
		t.Fatalf("Run without read permission = %v (context: %v), want the fetch's error", err, runCtx.Err())
	}
	t.Logf("Run: %v", err)
	if kerr.IsRetriable(err) {
		t.Fatalf("Run returned a retriable error: %v", err)
	}
}

// openTxn opens a transact session on cfg, closed when the test ends.
func openTxn(ctx context.Context, t *testing.T, cfg SourceConfig) *TransactSession {
	t.Helper()
	sess, err := NewTransactSession(ctx, txnOf(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	return sess
}

// outTopic creates the output topic of cfg's test, with partitions
// partitions, and returns its name.
func outTopic(t *testing.T, cfg SourceConfig, partitions int32) string {
	t.Helper()
	out := cfg.Topic + ".out"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := CreateTopics(ctx, SourceConfig{ClientConfig: ClientConfig{Brokers: cfg.Brokers}, Topic: out}, partitions, 1); err != nil {
		t.Fatal(err)
	}
	return out
}
