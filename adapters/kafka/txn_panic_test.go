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

// TestTransactSessionAbortsOnPanic: a Transform that panics (after emitting
// an output) panics out of Run, but its transaction is aborted first: no
// transaction stays open, holding back read_committed readers of the outputs
// until the broker's transaction timeout (40s by default), and a Run called
// again (a supervisor that recovered the panic) consumes the record again
// and commits its output once. Before, the transaction stayed open, the
// record was taken as consumed, and the next batch's Begin failed.
func TestTransactSessionAbortsOnPanic(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := outTopic(t, cfg, 1)
	publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
	sess := openTxn(ctx, t, cfg)
	var calls atomic.Int64
	fn := func(_ context.Context, m *ackwise.Message, emit func(Output)) error {
		emit(Output{Topic: out, Key: m.Key, Payload: m.Payload, ID: m.ID})
		if calls.Add(1) == 1 {
			panic("transform bug")
		}
		return nil
	}
	func() {
		defer func() {
			if p := recover(); p != "transform bug" {
				t.Fatalf("Run recovered %v, want the Transform's panic", p)
			}
		}()
		_ = sess.Run(ctx, fn)
	}()
	txs, err := kadm.NewClient(sess.sess.Client()).DescribeTransactions(ctx, cfg.Topic+"-tx")
	if err != nil {
		t.Fatal(err)
	}
	for _, tx := range txs {
		if tx.State == "Ongoing" {
			t.Fatalf("after the panic, transaction %s is still open: %+v", tx.TxnID, tx)
		}
	}
	done, stop := runTxn(ctx, sess, fn)
	waitTxnCommitted(ctx, t, sess, cfg, 1, done)
	if err := stop(); err != nil {
		t.Fatalf("Run after the panic = %v", err)
	}
	if recs := readIsolated(ctx, t, brokers, out, kgo.ReadCommitted()); len(recs) != 1 {
		t.Fatalf("%d committed outputs, want 1 (the panicked attempt's aborted)", len(recs))
	}
}
