package kafka

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// TestReleaseOnHeldRetryPartitionRedelivers: a retry partition is paused
// while a record waits for its due time. A record of it released meanwhile
// (the engine releases one whose move to the next tier failed) used to wait
// for the paused partition to resume, once every held record came due: up
// to a whole tier. It is delivered again at once.
func TestReleaseOnHeldRetryPartitionRedelivers(t *testing.T) {
	t.Parallel()
	// With room for one message the later record is held (and the
	// partition paused) after the release; with room for two, before it.
	for _, room := range []int{1, 2} {
		t.Run("room="+strconv.Itoa(room), func(t *testing.T) {
			t.Parallel()
			releaseHeldRetry(t, room)
		})
	}
}

func releaseHeldRetry(t *testing.T, room int) {
	brokers := newCluster(t)
	const tier = time.Hour
	cfg := testConfig(t, brokers, 1, tier)
	src := openSource(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	retryTopic := DefaultRetryTopic(cfg.Topic, tier)
	rec := func(id string, due time.Time) *kgo.Record {
		return &kgo.Record{Topic: retryTopic, Key: []byte(id), Value: []byte("v"), Headers: []kgo.RecordHeader{
			{Key: ackwise.HeaderEventID, Value: []byte(id)},
			{Key: ackwise.HeaderAttempt, Value: []byte("2")},
			{Key: HeaderRetryDue, Value: []byte(strconv.FormatInt(due.UnixMilli(), 10))},
			{Key: HeaderRetryGroup, Value: []byte(cfg.Group)},
			{Key: HeaderOriginalTopic, Value: []byte(cfg.Topic)},
			{Key: HeaderOriginalPartition, Value: []byte("0")},
			{Key: HeaderOriginalOffset, Value: []byte("0")},
		}}
	}
	if err := src.Client().ProduceSync(ctx, rec("due", time.Now()), rec("later", time.Now().Add(tier))).FirstErr(); err != nil {
		t.Fatal(err)
	}
	buf := make([]*ackwise.Message, room)
	if n, err := src.Receive(ctx, buf); n != 1 || err != nil || buf[0].ID != "due" {
		t.Fatalf("Receive = %d, %v", n, err)
	}
	if err := src.Release(ctx, buf[0]); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	n, err := src.Receive(rctx, buf)
	if n != 1 || err != nil {
		t.Fatalf("the released retry record was not delivered again within 10s while a record due in %v was held: n=%d err=%v", tier, n, err)
	}
	if buf[0].ID != "due" {
		t.Fatalf("delivered %s, want the released record", buf[0].ID)
	}
}

// TestReleaseNotOvertakenByFetchedRecords: records fetched with a released
// record, not yet delivered, wait for it: the partition is rewound to the
// released record, and it comes first, then the rest in offset order. Before,
// the records waiting in the source were delivered at once, ahead of the
// released one (a key's later message ran before its earlier one came back).
func TestReleaseNotOvertakenByFetchedRecords(t *testing.T) {
	t.Parallel()
	src, first := firstOfFour(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := src.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	requireOffsets(t, src, 0, 1, 2, 3)
}

// TestReleasedRecordGoneDoesNotStall: a released record that is no longer in
// the log when the partition is fetched again (deleted by retention, or
// compacted away) is given up, with a warning, and the partition goes on.
// Records fetched after the rewind to it are not held back waiting for it:
// they would wait for ever.
func TestReleasedRecordGoneDoesNotStall(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	sink := openSink(t, cfg)
	publishN(t, sink, 2, func(int) string { return "k" })
	src := openSource(t, cfg)
	first := receiveN(t, src, 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Retention deletes the records before the rewind fetches them again.
	dr, err := kadm.NewClient(src.Client()).DeleteRecords(ctx, kadm.Offsets{cfg.Topic: {0: {At: 2}}})
	if err == nil {
		err = dr.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	publishN(t, sink, 1, func(int) string { return "k" })
	got := receiveN(t, src, 1)[0]
	if got.Offset != 2 {
		t.Fatalf("delivered offset %d, want 2, the one record left", got.Offset)
	}
	if err := src.Ack(ctx, got); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 0, 3)
}

// TestReleaseBeforeItsRewindHoldsFetchedRecords: between a Release and its
// rewind, records fetched before are still held back, not taken for
// records past a released record that is gone from the log (which would
// settle the released record unhandled: lost).
func TestReleaseBeforeItsRewindHoldsFetchedRecords(t *testing.T) {
	t.Parallel()
	src, first := firstOfFour(t)
	src.testRewindChecked = func() {
		src.testRewindChecked = nil
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		buf := make([]*ackwise.Message, 4)
		if n, _ := src.Receive(ctx, buf); n > 0 {
			t.Errorf("offset %d delivered before the rewind to the released offset %d", buf[0].Offset, first.Offset)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := src.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
	requireOffsets(t, src, 0, 1, 2, 3)
}

// requireOffsets receives len(want) messages from src and checks their
// offsets, in order.
func requireOffsets(t *testing.T, src *Source, want ...int64) {
	t.Helper()
	var got []int64
	for _, m := range receiveN(t, src, len(want)) {
		got = append(got, m.Offset)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("offsets delivered %v, want %v", got, want)
	}
}

// firstOfFour opens a source on a partition of four records of one key and
// receives the first; the other three wait in the source.
func firstOfFour(t *testing.T) (*Source, *ackwise.Message) {
	t.Helper()
	cfg := testConfig(t, newCluster(t), 1)
	publishN(t, openSink(t, cfg), 4, func(int) string { return "k" })
	src := openSource(t, cfg)
	return src, receiveN(t, src, 1)[0]
}
