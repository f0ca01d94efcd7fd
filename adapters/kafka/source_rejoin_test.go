package kafka

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ackwise/ackwise"
)

// TestReceiveSurvivesLostGroupSession: a member the coordinator forgot
// (UNKNOWN_MEMBER_ID on a heartbeat) is lost and rejoins by itself; franz-go
// reports the lost session in a poll as an ErrGroupSession wrapping a Kafka
// error marked not retriable. Receive must not return it as a fatal error
// (callers driving the source directly would stop); the records go on
// arriving in the new session.
func TestReceiveSurvivesLostGroupSession(t *testing.T) {
	t.Parallel()
	c := newKfake(t)
	cfg := testConfig(t, c.ListenAddrs(), 1)
	cfg.Options = fastGroup
	sink := openSink(t, cfg)
	publishN(t, sink, 1, func(int) string { return "k" })
	src := openSource(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := src.Ack(ctx, receiveN(t, src, 1)[0]); err != nil {
		t.Fatal(err)
	}
	forgetMember(ctx, t, c)
	publishN(t, sink, 1, func(i int) string { return "k" + strconv.Itoa(i) })
	buf := make([]*ackwise.Message, 1)
	for {
		n, err := src.Receive(ctx, buf)
		if err != nil {
			t.Fatalf("Receive after the coordinator forgot the member: %v", err)
		}
		if n == 1 && buf[0].Offset == 1 {
			return
		}
	}
}

// forgetMember makes the coordinator answer the next heartbeat with
// UNKNOWN_MEMBER_ID, as if the member's session had expired, and returns
// once it did.
func forgetMember(ctx context.Context, t *testing.T, c *kfake.Cluster) {
	t.Helper()
	forgot := make(chan struct{})
	var once sync.Once
	c.ControlKey(kmsg.Heartbeat.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		resp := req.(*kmsg.HeartbeatRequest).ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = kerr.UnknownMemberID.Code
		once.Do(func() { close(forgot) })
		return resp, nil, true
	})
	select {
	case <-forgot:
	case <-ctx.Done():
		t.Fatal("no heartbeat")
	}
}

// TestReportFetch: which fetch errors Receive returns to its caller. The
// notices franz-go cures by itself stay in the log; a failure outside
// Kafka's error codes (a TLS handshake refused after a certificate
// rotation) is returned, as it was before the lost-membership fix narrowed
// the rule to Kafka codes: only logged, the default Logger hides it.
func TestReportFetch(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"lost membership", &kgo.ErrGroupSession{Err: kerr.UnknownMemberID}, false},
		{"data loss", &kgo.ErrDataLoss{Topic: "t", ResetTo: 1, ConsumedTo: 5}, false},
		{"retriable", kerr.NotLeaderForPartition, false},
		{"authorization", kerr.TopicAuthorizationFailed, true},
		{"outside Kafka codes", errors.New("remote error: tls: bad certificate"), true},
	} {
		if got := reportFetch(c.err); got != c.want {
			t.Errorf("%s: reportFetch(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
