package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/adaptertest"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// endOffsets returns the sum of topic's end offsets.
func endOffsets(ctx context.Context, t *testing.T, adm *kadm.Client, topic string) int64 {
	t.Helper()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("list end offsets of %s: %v", topic, err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

// waitEnd waits until topic holds n records.
func waitEnd(ctx context.Context, t *testing.T, brokers []string, topic string, n int64) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		got := endOffsets(ctx, t, adm, topic)
		if got == n {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("%s holds %d records, want %d: %v", topic, got, n, ctx.Err())
		}
	}
}

// TestRedriveIntoAFailingConsumerEnds: a redrive from a dead-letter topic
// into a topic whose consumer (the engine) still fails every record and
// dead-letters it back into the topic the run reads. Before, such a run
// moved the same dead letters round and round and never ended. Now the
// source tells the run what its group had yet to read as it started
// (Backlog), the run moves each dead letter once and ends there
// (StopBacklog), committing them; the second and third runs of the group
// do the same with the dead letters that came back; the fourth leaves
// them all (redrive count 3, RedriveLimited) and commits nothing, and a
// forced fifth moves them again.
func TestRedriveIntoAFailingConsumerEnds(t *testing.T) {
	t.Parallel()
	const n = 200
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	dead := cfg.Topic + DefaultDeadLetterSuffix
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute) // generous: a busy machine
	defer cancel()

	runConsumer(t, openSource(t, cfg), ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		return ackwise.Permanent(errors.New("still broken"))
	}), consumer.Config{Name: "billing"})
	msgs := make([]*ackwise.Message, n)
	for i := range msgs {
		msgs[i] = &ackwise.Message{ID: fmt.Sprint("e", i), Key: fmt.Sprint("k", i), Payload: []byte("p")}
	}
	if err := openSink(t, cfg).Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	waitEnd(ctx, t, brokers, dead, n)

	group := uniq("redrive")
	// Each run must end by itself: within two minutes, not at the Max
	// safety net (which a run without the fix reaches). The idle timeout
	// covers joining the group.
	opts := dlq.RedriveOptions{Rate: dlq.RateUnlimited, IdleTimeout: 15 * time.Second, Max: 5 * n}
	run := func(opts dlq.RedriveOptions) (dlq.RedriveResult, int, int) {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		from, err := NewSource(rctx, SourceConfig{ClientConfig: ClientConfig{Brokers: brokers}, Topic: dead, Group: group, CommitInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer from.Close()
		to := openSink(t, SourceConfig{ClientConfig: ClientConfig{Brokers: brokers}, Topic: cfg.Topic})
		defer to.Close()
		res, moved, limited := adaptertest.RedriveRun(rctx, t, from, to, opts)
		if err := from.Close(); err != nil {
			t.Fatal(err)
		}
		return res, len(moved), limited
	}
	// requireCounts checks the redrive count of the dead letters at
	// offsets [from, from+n) of the dead-letter topic.
	requireCounts := func(from int, want string) {
		t.Helper()
		recs := readAll(ctx, t, brokers, dead)
		if len(recs) < from+n {
			t.Fatalf("dead-letter topic holds %d records, want %d", len(recs), from+n)
		}
		for _, r := range recs[from : from+n] {
			if got := recordMessage(r).Headers.Get(dlq.HeaderRedriveCount); got != want {
				t.Fatalf("offset %d: %s = %q, want %q", r.Offset, dlq.HeaderRedriveCount, got, want)
			}
		}
	}

	for k := 1; k <= dlq.DefaultMaxRedrives; k++ {
		res, moved, _ := run(opts)
		if res.Moved != n || moved != n || res.Stop != dlq.StopBacklog || res.Backlog != n || res.RedriveLimited != 0 || res.AlreadyMoved != 0 {
			t.Fatalf("run %d: %+v, %d events moved; want %d moved once each, stopped at a backlog of %d", k, res, moved, n, n)
		}
		waitEnd(ctx, t, brokers, dead, int64((k+1)*n)) // every one failed again
		requireCounts(k*n, strconv.Itoa(k))
	}

	res, moved, limited := run(opts)
	if res.Moved != 0 || moved != 0 || res.RedriveLimited != n || limited != n || res.Stop != dlq.StopBacklog || res.Backlog != n {
		t.Fatalf("run past the limit: %+v (%d reported); want nothing moved, %d left", res, limited, n)
	}

	opts.Force = true
	res, moved, _ = run(opts)
	if res.Moved != n || moved != n || res.Stop != dlq.StopBacklog || res.Backlog != n {
		t.Fatalf("forced run: %+v; want %d moved", res, n)
	}
	waitEnd(ctx, t, brokers, dead, int64((dlq.DefaultMaxRedrives+2)*n))
	requireCounts((dlq.DefaultMaxRedrives+1)*n, strconv.Itoa(dlq.DefaultMaxRedrives+1))
}

// TestBacklog: Backlog counts the records of the topic the group has not
// committed, less those above the committed offset that are settled
// already; it is an error for a topic that does not exist.
func TestBacklog(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 10
	msgs := make([]*ackwise.Message, n)
	for i := range msgs {
		msgs[i] = &ackwise.Message{ID: fmt.Sprint("e", i), Key: fmt.Sprint("k", i), Payload: []byte("p")}
	}
	if err := openSink(t, cfg).Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	src := openSource(t, cfg)
	if got, err := src.Backlog(ctx); err != nil || got != n {
		t.Fatalf("Backlog = %d, %v; want %d (nothing committed)", got, err, n)
	}
	// Ack every other record received: the committed offsets stop below
	// the first unsettled one of each partition, the commit metadata names
	// the settled ones above it.
	buf := make([]*ackwise.Message, n)
	for got := 0; got < n; {
		k, err := src.Receive(ctx, buf[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += k
	}
	acked := 0
	for i, m := range buf {
		if i%2 == 0 {
			if err := src.Ack(ctx, m); err != nil {
				t.Fatal(err)
			}
			acked++
		}
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	src = openSource(t, cfg)
	if got, err := src.Backlog(ctx); err != nil || got != n-acked {
		t.Fatalf("Backlog = %d, %v after %d of %d acked; want %d", got, err, acked, n, n-acked)
	}
	// GroupOffsets tells the same per partition, without joining the group.
	offs, err := GroupOffsets(ctx, cfg)
	if err != nil || len(offs) != 2 {
		t.Fatalf("GroupOffsets = %+v, %v; want 2 partitions", offs, err)
	}
	var lag, end, done int64
	for _, o := range offs {
		lag, end, done = lag+o.Lag(), end+o.End, done+o.Committed+o.Settled
	}
	if lag != int64(n-acked) || end != n || done != int64(acked) {
		t.Fatalf("GroupOffsets = %+v: lag %d, end %d, committed+settled %d; want %d, %d, %d", offs, lag, end, done, n-acked, n, acked)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).DeleteTopic(ctx, cfg.Topic); err != nil {
		t.Fatal(err)
	}
	if got, err := src.Backlog(ctx); err == nil {
		t.Fatalf("Backlog of a deleted topic = %d, no error", got)
	}
}
