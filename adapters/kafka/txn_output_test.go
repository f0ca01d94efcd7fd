package kafka

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/internal/logbuf"
)

// TestTransactSessionOutputIDOverridesCopiedHeader: a Transform that passes
// the input's headers on (trace context and the like) and gives each output
// its own ID gets outputs with that ID. Before, the input's ackwise-event-id
// header, copied along, won over Output.ID: the two outputs of one input
// carried the input's event ID, and an idempotency inbox downstream dropped
// the second as a duplicate of the first.
func TestTransactSessionOutputIDOverridesCopiedHeader(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := outTopic(t, cfg, 1)
	in := publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
	sess := openTxn(ctx, t, cfg)
	fn := func(_ context.Context, m *ackwise.Message, emit func(Output)) error {
		emit(Output{Topic: out, Key: m.Key, Payload: m.Payload, Headers: m.Headers.Clone(), ID: m.ID + "-a"})
		emit(Output{Topic: out, Key: m.Key, Payload: m.Payload, Headers: m.Headers.Clone(), ID: m.ID + "-b"})
		// No ID: the header passed on is kept.
		emit(Output{Topic: out, Key: m.Key, Payload: m.Payload, Headers: m.Headers.Clone()})
		return nil
	}
	done, stop := runTxn(ctx, sess, fn)
	waitTxnCommitted(ctx, t, sess, cfg, 1, done)
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	recs := readIsolated(ctx, t, brokers, out, kgo.ReadCommitted())
	var ids []string
	for _, r := range recs {
		var rid []string
		for _, h := range r.Headers {
			if h.Key == ackwise.HeaderEventID {
				rid = append(rid, string(h.Value))
			}
		}
		if len(rid) != 1 {
			t.Errorf("output at %d has event ID headers %q, want one", r.Offset, rid)
			continue
		}
		if m := recordMessage(r); m.Headers.Get("x-seq") != "0" {
			t.Errorf("output %s lost header x-seq: %v", rid[0], m.Headers)
		}
		ids = append(ids, rid[0])
	}
	sort.Strings(ids)
	want := []string{in[0].ID, in[0].ID + "-a", in[0].ID + "-b"}
	if len(ids) != len(want) || ids[0] != want[0] || ids[1] != want[1] || ids[2] != want[2] {
		t.Fatalf("output event IDs %q, want %q", ids, want)
	}
}

// waitTxnCommitted waits until sess, running with its result going to done,
// runTxn runs sess.Run(fn) in the background until stop, which returns
// Run's error (the same on every call). done receives that error when Run
// returns on its own.
func runTxn(ctx context.Context, sess *TransactSession, fn Transform) (done <-chan error, stop func() error) {
	runCtx, cancel := context.WithCancel(ctx)
	ch := make(chan error, 1)
	go func() { ch <- sess.Run(runCtx, fn) }()
	var once sync.Once
	var err error
	return ch, func() error {
		once.Do(func() {
			cancel()
			err = <-ch
		})
		return err
	}
}

// committed the input offset at of partition 0 of cfg.Topic.
func waitTxnCommitted(ctx context.Context, t *testing.T, sess *TransactSession, cfg SourceConfig, at int64, done <-chan error) {
	t.Helper()
	adm := kadm.NewClient(sess.sess.Client())
	for { // polling: the broker has no commit notification
		offs, err := adm.FetchOffsets(ctx, cfg.Group)
		if o, ok := offs.Lookup(cfg.Topic, 0); err == nil && ok && o.At == at {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("Run = %v before the input was committed", err)
		case <-ctx.Done():
			t.Fatal("input offset never committed")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestTransactSessionAbortsAfterFlushTimeout: a flush of the outputs that
// runs out of time (the broker slow to confirm them) aborts the batch,
// which is consumed again and commits once; the log says the flush ran out
// of its time, not only "context deadline exceeded". Before, the flush and End
// shared one budget: the flush used it up, End failed at once without
// aborting, Run ended, and the transaction stayed open until the broker's
// transaction timeout.
func TestTransactSessionAbortsAfterFlushTimeout(t *testing.T) {
	t.Parallel()
	c := newKfake(t)
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, 1)
	logs := &logbuf.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out := outTopic(t, cfg, 1)
	publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
	sess := openTxn(ctx, t, cfg)
	sess.endTimeout = time.Second
	// The first produce from here on, the output's, is answered after one
	// and a half flush budgets: a slow broker, not a wait for an event. The
	// flush runs out of time; End, with a budget of its own, has the time
	// to wait for the produce and abort.
	var slowed atomic.Bool
	c.ControlKey(kmsg.Produce.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		if slowed.CompareAndSwap(false, true) {
			c.SleepControl(func() { time.Sleep(sess.endTimeout * 3 / 2) })
		}
		c.DropControl()
		return nil, nil, false // kfake handles it
	})
	done, stop := runTxn(ctx, sess, func(_ context.Context, m *ackwise.Message, emit func(Output)) error {
		emit(Output{Topic: out, Key: m.Key, Payload: m.Payload, ID: m.ID})
		return nil
	})
	waitTxnCommitted(ctx, t, sess, cfg, 1, done)
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if recs := readIsolated(ctx, t, brokers, out, kgo.ReadCommitted()); len(recs) != 1 {
		t.Fatalf("%d committed outputs, want 1 (the aborted attempt's output invisible)", len(recs))
	}
	if !strings.Contains(logs.String(), "not all confirmed within 1s") {
		t.Errorf("the flush's timeout not named in the logs:\n%s", logs.String())
	}
}
