package kafka

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// TestTransactSessionCountsAttempts: a record consumed again after its
// batch was aborted comes with Attempt one higher and the time of the first
// failure, so that a Transform can dead-letter a poison record after a few
// attempts (inside the transaction) instead of stalling the session for
// ever. The record before it in the batch, delivered and aborted with it,
// counts its deliveries too; both counts are forgotten once they commit.
// Before, every delivery had Attempt 1: Message.Attempt's promise (the
// number of this delivery attempt) was broken and a poison record could not
// be told from a fresh one.
func TestTransactSessionCountsAttempts(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := outTopic(t, cfg, 1)
	dead := outTopic(t, SourceConfig{ClientConfig: ClientConfig{Brokers: brokers}, Topic: cfg.Topic + ".dlq"}, 1)
	sink := openSink(t, cfg)
	publishN(t, sink, 2, func(int) string { return "k" })
	sess := openTxn(ctx, t, cfg)
	const maxAttempts = 3
	const poison = 1 // the offset of the poison record
	type delivery struct {
		offset  int64
		attempt int
		first   time.Time
	}
	got := make(chan delivery, 100)
	fn := func(_ context.Context, m *ackwise.Message, emit func(Output)) error {
		got <- delivery{m.Offset, m.Attempt, m.FirstFailure}
		if m.Offset != poison {
			emit(Output{Topic: out, Key: m.Key, Payload: m.Payload, ID: m.ID})
			return nil
		}
		if m.Attempt < maxAttempts {
			return errors.New("poison")
		}
		emit(Output{Topic: dead, Key: m.Key, Payload: m.Payload, ID: m.ID})
		return nil
	}
	done, stop := runTxn(ctx, sess, fn)
	waitTxnCommitted(ctx, t, sess, cfg, 2, done)
	// A third record, after the two committed: a first delivery again.
	publishN(t, sink, 1, func(int) string { return "k" })
	waitTxnCommitted(ctx, t, sess, cfg, 3, done)
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	close(got)
	attempts := map[int64][]int{}
	var firstFailure time.Time
	for d := range got {
		attempts[d.offset] = append(attempts[d.offset], d.attempt)
		switch {
		case d.attempt == 1 && !d.first.IsZero():
			t.Errorf("offset %d attempt 1 has FirstFailure %v, want none", d.offset, d.first)
		case d.attempt > 1 && d.first.IsZero():
			t.Errorf("offset %d attempt %d has no FirstFailure", d.offset, d.attempt)
		case d.attempt > 1 && !firstFailure.IsZero() && d.offset == poison && !d.first.Equal(firstFailure):
			t.Errorf("offset %d attempt %d has FirstFailure %v, want the first one, %v", d.offset, d.attempt, d.first, firstFailure)
		case d.attempt > 1 && d.offset == poison:
			firstFailure = d.first
		}
	}
	want := map[int64]string{0: "[1 2 3]", poison: "[1 2 3]", 2: "[1]"}
	for off, w := range want {
		if g := fmt.Sprint(attempts[off]); g != w {
			t.Errorf("offset %d delivered with attempts %s, want %s", off, g, w)
		}
	}
	if recs := readIsolated(ctx, t, brokers, dead, kgo.ReadCommitted()); len(recs) != 1 || string(recs[0].Value) != "1" {
		t.Errorf("%d dead letters committed, want the poison record's", len(recs))
	}
	if recs := readIsolated(ctx, t, brokers, out, kgo.ReadCommitted()); len(recs) != 2 {
		t.Errorf("%d outputs committed, want 2 (offsets 0 and 2)", len(recs))
	}
}
