package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// fastGroup makes group changes show within a test's patience.
var fastGroup = []kgo.Opt{kgo.HeartbeatInterval(100 * time.Millisecond), kgo.SessionTimeout(6 * time.Second)}

func publishN(t *testing.T, sink *Sink, n int, key func(i int) string) []*ackwise.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs := make([]*ackwise.Message, n)
	for i := range msgs {
		msgs[i] = &ackwise.Message{ID: fmt.Sprintf("ev-%d", i), Key: key(i), Payload: []byte(strconv.Itoa(i)), Headers: ackwise.HeadersOf("x-seq", strconv.Itoa(i))}
	}
	if err := sink.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// receiveN receives exactly n messages.
func receiveN(t *testing.T, src adapters.Source, n int) []*ackwise.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // generous on a busy machine
	defer cancel()
	var out []*ackwise.Message
	for len(out) < n {
		buf := make([]*ackwise.Message, n-len(out))
		k, err := src.Receive(ctx, buf)
		if err != nil {
			t.Fatalf("receive after %d of %d: %v", len(out), n, err)
		}
		out = append(out, buf[:k]...)
	}
	return out
}

// waitCommitted polls the group's committed offset until it equals want:
// the broker offers no notification of commits.
func waitCommitted(t *testing.T, brokers []string, group, topic string, partition int32, want int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // generous on a busy machine
	defer cancel()
	for {
		got := committed(ctx, t, brokers, group, topic, partition)
		if got == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("committed offset of %s/%d is %d, want %d", topic, partition, got, want)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func TestCommitsOnlySettledOffsets(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	sink := openSink(t, cfg)
	publishN(t, sink, 10, func(i int) string { return "k" + strconv.Itoa(i) })
	src := openSource(t, cfg)
	msgs := receiveN(t, src, 10)
	ctx := context.Background()
	for i, m := range msgs {
		if m.Offset != int64(i) || m.Source != cfg.Topic || m.BrokerID != fmt.Sprintf("%s/0@%d", cfg.Topic, i) || m.ID != fmt.Sprintf("ev-%d", i) || m.Attempt != 1 || m.PublishedAt.IsZero() {
			t.Fatalf("message %d: %+v", i, m)
		}
	}
	// Settle out of order, all but offset 3.
	for i := 9; i >= 0; i-- {
		if i == 3 {
			continue
		}
		if err := src.Ack(ctx, msgs[i]); err != nil {
			t.Fatal(err)
		}
	}
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 0, 3)
	if err := src.Ack(ctx, msgs[5]); err == nil {
		t.Fatal("second ack of the same record accepted")
	}
	// A crash now (Close without settling 3) replays offset 3 only: the
	// commit metadata carries the settled offsets above it.
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if err := src.Ack(ctx, msgs[3]); !errors.Is(err, adapters.ErrReceiptInvalid) {
		t.Fatalf("ack after close: %v, want ErrReceiptInvalid", err)
	}
	src2 := openSource(t, cfg)
	again := receiveN(t, src2, 1)
	if again[0].Offset != 3 {
		t.Fatalf("replayed offset %d, want 3", again[0].Offset)
	}
	if err := src2.Ack(ctx, again[0]); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 0, 10)
	// Nothing else comes back.
	more := publishN(t, sink, 1, func(int) string { return "late" })
	got := receiveN(t, src2, 1)
	if got[0].ID != more[0].ID {
		t.Fatalf("after the replay got %s (offset %d), want the new record", got[0].ID, got[0].Offset)
	}
}

func TestRevokedPartitionInvalidates(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 2)
	cfg.Options = fastGroup
	cfg.RevokeTimeout = -1 // revoke at once, handlers or not
	sink := openSink(t, cfg)
	publishN(t, sink, 40, func(i int) string { return "k" + strconv.Itoa(i) })
	a := openSource(t, cfg)
	msgs := receiveN(t, a, 40)
	byPart := map[int32][]*ackwise.Message{}
	for _, m := range msgs {
		byPart[m.Partition] = append(byPart[m.Partition], m)
	}
	if len(byPart) != 2 {
		t.Fatalf("records in %d partitions, want 2", len(byPart))
	}
	b := openSource(t, cfg)
	// B gets one partition: the records A held unsettled there come to B.
	got := receiveN(t, b, 1)[0]
	moved := got.Partition
	kept := 1 - moved
	for _, m := range byPart[moved] {
		if a.Valid(m) {
			t.Fatalf("A still considers %s valid after its partition moved", m.BrokerID)
		}
		if err := a.Ack(context.Background(), m); !errors.Is(err, adapters.ErrReceiptInvalid) {
			t.Fatalf("ack of %s after revocation: %v, want ErrReceiptInvalid", m.BrokerID, err)
		}
	}
	if got.Offset != byPart[moved][0].Offset {
		t.Fatalf("B started at offset %d, want %d (nothing was settled)", got.Offset, byPart[moved][0].Offset)
	}
	for _, m := range byPart[kept] {
		if !a.Valid(m) {
			t.Fatalf("%s invalid, but its partition stayed", m.BrokerID)
		}
		if err := a.Ack(context.Background(), m); err != nil {
			t.Fatalf("ack on the kept partition: %v", err)
		}
	}
}

func TestRevokeCommitsWhatRunningHandlersSettle(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 2)
	cfg.Options = fastGroup
	cfg.RevokeTimeout = 5 * time.Second
	sink := openSink(t, cfg)
	publishN(t, sink, 40, func(i int) string { return "k" + strconv.Itoa(i) })
	a := openSource(t, cfg)
	msgs := receiveN(t, a, 40)
	first := map[int32]*ackwise.Message{}
	count := map[int32]int64{}
	for _, m := range msgs {
		count[m.Partition]++
		if first[m.Partition] == nil {
			first[m.Partition] = m
		} else if err := a.Ack(context.Background(), m); err != nil { // all but the first of each partition
			t.Fatal(err)
		}
	}
	// B joins; the revoked partition's first record is still "running" on A.
	b := openSource(t, cfg)
	bctx, bcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer bcancel()
	received := make(chan *ackwise.Message, 1)
	go func() {
		buf := make([]*ackwise.Message, 1)
		if n, err := b.Receive(bctx, buf); n == 1 && err == nil {
			received <- buf[0]
		}
		close(received)
	}()
	// Wait until A is revoking one of its partitions (Valid turns false; no
	// event to await), then finish the running handler there.
	var revoking *ackwise.Message
	deadline := time.Now().Add(10 * time.Second)
	for revoking == nil {
		for _, m := range first {
			if !a.Valid(m) {
				revoking = m
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no partition was revoked from A")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case m := <-received:
		t.Fatalf("B received %s while A's handler was still running on it", m.BrokerID)
	default:
	}
	if err := a.Ack(context.Background(), revoking); err != nil {
		t.Fatalf("ack while revoking: %v", err)
	}
	// All of the partition was settled and committed before the hand-over:
	// B gets nothing from it. Publish one more to that partition's key.
	n := count[revoking.Partition]
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, revoking.Partition, n)
	publishN(t, sink, 1, func(int) string { return revoking.Key })
	m, ok := <-received
	if !ok {
		t.Fatal("B received nothing")
	}
	if m.Offset != n || m.Partition != revoking.Partition {
		t.Fatalf("B received %s, want the new record at offset %d of partition %d", m.BrokerID, n, revoking.Partition)
	}
}

// TestSlowHandlerKeepsMembership holds a record for more than twice the
// session timeout without polling: franz-go heartbeats in the background, the
// member keeps its partition and the late ack commits.
func TestSlowHandlerKeepsMembership(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	cfg.Options = []kgo.Opt{kgo.SessionTimeout(time.Second), kgo.HeartbeatInterval(100 * time.Millisecond)}
	publishN(t, openSink(t, cfg), 1, func(int) string { return "slow" })
	src := openSource(t, cfg)
	m := receiveN(t, src, 1)[0]
	time.Sleep(2500 * time.Millisecond) // the slow handler itself, not a wait for an event
	if !src.Valid(m) {
		t.Fatal("member lost its partition while a handler was slow")
	}
	if err := src.Ack(context.Background(), m); err != nil {
		t.Fatalf("late ack: %v", err)
	}
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 0, 1)
}

// TestReleaseRedeliversOnKeptPartition: the engine releases a record whose
// settle failed (a dead letter or retry move the broker refused). A released
// record of a partition this member keeps must come back; before the fix it
// was never delivered again until the member left, and it held the
// partition's commit back meanwhile, so the tracker grew with every record
// after it (unbounded memory).
func TestReleaseRedeliversOnKeptPartition(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	sink := openSink(t, cfg)
	in := publishN(t, sink, 3, func(i int) string { return "k" + strconv.Itoa(i) })
	src := openSource(t, cfg)
	ctx := context.Background()
	got := receiveN(t, src, 3)
	if err := src.Release(ctx, got[0]); err != nil {
		t.Fatal(err)
	}
	for _, m := range got[1:] {
		if err := src.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	again := receiveN(t, src, 1)[0]
	if again.ID != in[0].ID || again.Offset != 0 {
		t.Fatalf("after the release got %s at offset %d, want %s at 0", again.ID, again.Offset, in[0].ID)
	}
	// The released delivery is spent: it cannot settle the new one.
	if err := src.Ack(ctx, got[0]); err == nil {
		t.Fatal("ack through the released delivery accepted")
	}
	if err := src.Ack(ctx, again); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 0, 3)
	// The records after it that were settled are not delivered again.
	next := publishN(t, sink, 1, func(int) string { return "late" })[0]
	if m := receiveN(t, src, 1)[0]; m.Offset != 3 || m.ID != next.ID {
		t.Fatalf("got %s at offset %d, want the new record at 3", m.ID, m.Offset)
	}
}
