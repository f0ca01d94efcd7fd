package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/ackwise/ackwise"
)

// TestTransactSessionSurvivesLostGroupSession: a member the coordinator
// forgot (UNKNOWN_MEMBER_ID on a heartbeat: its session expired during a
// network blip, say) is lost and rejoins; franz-go reports the lost session
// in a poll as an ErrGroupSession. Run goes on with the new session. Before,
// Run took the wrapped UNKNOWN_MEMBER_ID (a kerr error marked not retriable)
// for a fatal fetch error and ended.
func TestTransactSessionSurvivesLostGroupSession(t *testing.T) {
	t.Parallel()
	c := newKfake(t)
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, 1)
	cfg.Options = fastGroup
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := outTopic(t, cfg, 1)
	sink := openSink(t, cfg)
	publishN(t, sink, 1, func(int) string { return "k" })
	sess := openTxn(ctx, t, cfg)
	fn := func(_ context.Context, m *ackwise.Message, emit func(Output)) error {
		emit(Output{Topic: out, Key: m.Key, Payload: m.Payload, ID: m.ID})
		return nil
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- sess.Run(runCtx, fn) }()
	// Polling the committed offset: the broker has no commit notification.
	adm := kadm.NewClient(sess.sess.Client())
	waitTxnCommitted := func(want int64) {
		t.Helper()
		for {
			offs, err := adm.FetchOffsets(ctx, cfg.Group)
			if o, ok := offs.Lookup(cfg.Topic, 0); err == nil && ok && o.At == want {
				return
			}
			select {
			case err := <-done:
				t.Fatalf("Run ended before offset %d was committed: %v", want, err)
			case <-ctx.Done():
				t.Fatalf("offset %d never committed", want)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	waitTxnCommitted(1)

	forgetMember(ctx, t, c)
	publishN(t, sink, 1, func(int) string { return "k" })

	// The second record is transformed and committed in the rejoined
	// session; Run must not have ended meanwhile.
	waitTxnCommitted(2)
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
}
