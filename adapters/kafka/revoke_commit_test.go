package kafka

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// TestAckDuringRevokeCommitFails: an Ack that lands while the revoke's
// commit is in flight is not in that commit, the last for the partition, so
// it must fail with ErrReceiptInvalid (the contract for a settle after
// revocation). Before, it returned nil and the next owner delivered the
// record again; for DeadLetter or Nack that was a second dead letter or
// retry copy.
func TestAckDuringRevokeCommitFails(t *testing.T) {
	t.Parallel()
	c := newKfake(t)
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, 2)
	cfg.Options = fastGroup
	cfg.CommitInterval = time.Hour // only the first periodic commit, then revoke commits
	cfg.RevokeTimeout = -1
	sink := openSink(t, cfg)
	publishN(t, sink, 30, func(i int) string { return "k" + strconv.Itoa(i) })
	a := openSource(t, cfg)
	msgs := receiveN(t, a, 30)
	byPart := map[int32][]*ackwise.Message{}
	for _, m := range msgs {
		byPart[m.Partition] = append(byPart[m.Partition], m)
	}
	if len(byPart) != 2 || len(byPart[0]) < 3 || len(byPart[1]) < 3 {
		t.Fatalf("spread %d/%d", len(byPart[0]), len(byPart[1]))
	}
	ctx := context.Background()
	// Both in one batch: one commit (the committer commits at most once
	// an hour after that).
	errs := make([]error, 2)
	a.AckBatch(ctx, []*ackwise.Message{byPart[0][0], byPart[1][0]}, errs)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 0, byPart[0][0].Offset+1)
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 1, byPart[1][0].Offset+1)
	for p := range int32(2) { // dirty, not committed (the committer waits an hour)
		if err := a.Ack(ctx, byPart[p][1]); err != nil {
			t.Fatal(err)
		}
	}
	started := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	c.ControlKey(kmsg.OffsetCommit.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		first := false
		once.Do(func() { first = true })
		if first {
			close(started)
			c.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})
	b := openSource(t, cfg)
	bgot := make(chan *ackwise.Message, 1)
	go func() {
		bctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		buf := make([]*ackwise.Message, 1)
		if n, err := b.Receive(bctx, buf); n == 1 && err == nil {
			bgot <- buf[0]
		}
		close(bgot)
	}()
	select {
	case <-started:
	case <-time.After(15 * time.Second):
		t.Fatal("no revoke commit")
	}
	var revoked int32 = -1
	for p := range int32(2) {
		if !a.Valid(byPart[p][2]) {
			revoked = p
		}
	}
	if revoked < 0 {
		t.Fatal("no partition revoking while the commit is in flight")
	}
	third := byPart[revoked][2]
	ackErr := a.Ack(ctx, third)
	close(release)
	m, ok := <-bgot
	if !ok {
		t.Fatal("B received nothing")
	}
	if !errors.Is(ackErr, adapters.ErrReceiptInvalid) {
		t.Fatalf("A's Ack of %s during the revoke's commit = %v, want ErrReceiptInvalid (B then received %s)", third.BrokerID, ackErr, m.BrokerID)
	}
}

// TestPollBlocksRebalance: the source's client is made with
// BlockRebalanceOnPoll, so that no rebalance callback runs between a poll
// and the filing of its records under their partitions (see Source.poll).
func TestPollBlocksRebalance(t *testing.T) {
	t.Parallel()
	src := openSource(t, testConfig(t, newCluster(t), 1))
	if on, _ := src.Client().OptValue(kgo.BlockRebalanceOnPoll).(bool); !on {
		t.Fatal("the source's client does not block rebalances on poll")
	}
}
