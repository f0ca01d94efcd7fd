package kafka

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// TestTransactSessionTransactionTimeout: a batch slower than the
// transaction timeout is aborted by the broker; what the session then
// commits must not include the timed-out attempt's output. On kfake, the
// commit of the late batch fails with PRODUCER_FENCED and Run ends with it
// (docs/kafka.md says so): nothing is committed, and no output is visible
// to read_committed readers.
func TestTransactSessionTransactionTimeout(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	cfg.Options = []kgo.Opt{kgo.TransactionTimeout(time.Second)}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := outTopic(t, cfg, 1)
	publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
	sess := openTxn(ctx, t, cfg)
	adm := kadm.NewClient(sess.sess.Client())
	var calls atomic.Int64
	fn := func(c context.Context, m *ackwise.Message, emit func(Output)) error {
		emit(Output{Topic: out, Key: m.Key, Payload: m.Payload, ID: m.ID})
		if calls.Add(1) > 1 {
			return nil
		}
		// Slow: until the broker aborted the transaction, which it tells
		// only when asked.
		if err := sess.sess.Client().Flush(c); err != nil {
			return err
		}
		for {
			txs, err := adm.DescribeTransactions(c, cfg.Topic+"-tx")
			if tx, ok := txs[cfg.Topic+"-tx"]; err == nil && ok && tx.State != "Ongoing" {
				return nil
			}
			select {
			case <-c.Done():
				return c.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	runCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	err := sess.Run(runCtx, fn)
	t.Logf("Run = %v", err)
	if err == nil {
		t.Fatalf("Run = nil after %d calls: want the commit's error", calls.Load())
	}
	if at := committed(ctx, t, brokers, cfg.Group, cfg.Topic, 0); at != -1 {
		t.Errorf("input committed at %d after the transaction timed out", at)
	}
	if recs := readIsolated(ctx, t, brokers, out, kgo.ReadCommitted()); len(recs) != 0 {
		t.Errorf("%d outputs of the timed-out transaction visible to read_committed", len(recs))
	}
}
