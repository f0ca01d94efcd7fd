package kafka

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/internal/logbuf"
)

// TestTransactSessionTransactionTimeout: a batch slower than the
// transaction timeout is aborted by the broker; what the session then
// commits must not include the timed-out attempt's output. On kfake, the
// commit of the late batch fails with PRODUCER_FENCED and Run ends with it
// (docs/kafka.md says so), an error that says the transaction timed out
// (ErrTransactionTimeout) and still wraps the broker's: nothing is
// committed, and no output is visible to read_committed readers. The
// batch was warned about once, at 80% of the timeout.
func TestTransactSessionTransactionTimeout(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	cfg.Options = []kgo.Opt{kgo.TransactionTimeout(time.Second)}
	logs := &logbuf.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	const warning = "80% of the transaction timeout"
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
		// only when asked, and the session warned of it.
		if err := sess.sess.Client().Flush(c); err != nil {
			return err
		}
		for {
			txs, err := adm.DescribeTransactions(c, cfg.Topic+"-tx")
			if tx, ok := txs[cfg.Topic+"-tx"]; err == nil && ok && tx.State != "Ongoing" && strings.Contains(logs.String(), warning) {
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
	if !errors.Is(err, ErrTransactionTimeout) || !strings.Contains(err.Error(), "transaction timeout 1s") {
		t.Errorf("Run = %v: want ErrTransactionTimeout, naming the timeout", err)
	}
	if !errors.Is(err, kerr.ProducerFenced) {
		t.Errorf("Run = %v: want the broker's PRODUCER_FENCED wrapped too", err)
	}
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Errorf("%d warnings at 80%% of the timeout, want 1; logs:\n%s", n, logs.String())
	}
	if at := committed(ctx, t, brokers, cfg.Group, cfg.Topic, 0); at != -1 {
		t.Errorf("input committed at %d after the transaction timed out", at)
	}
	if recs := readIsolated(ctx, t, brokers, out, kgo.ReadCommitted()); len(recs) != 0 {
		t.Errorf("%d outputs of the timed-out transaction visible to read_committed", len(recs))
	}
}
