package kafka

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/dlq"
)

// oldestT0 is the first failure time of the dead letters of the Oldest
// tests, which fail at oldestT0 plus whole minutes.
var oldestT0 = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

// deadLetterAt is a dead letter of event id that failed for the last time
// at oldestT0 plus min minutes, for partition p (a manual partitioner) and
// written with a record timestamp an hour later than that, so that a test
// tells the envelope's time from the record's.
func deadLetterAt(id string, p int32, min int) *kgo.Record {
	at := oldestT0.Add(time.Duration(min) * time.Minute)
	msg := &ackwise.Message{ID: id, Source: "orders", Partition: p, Offset: int64(min)}
	env := dlq.New(msg, dlq.ReasonPermanent, errors.New("bad input"), ackwise.ClassPermanent, at, "billing", "v1")
	rec := &kgo.Record{Partition: p, Value: []byte(id), Timestamp: at.Add(time.Hour)}
	for _, kv := range env.Apply(ackwise.HeadersOf(ackwise.HeaderEventID, id)) {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: kv.Key, Value: []byte(kv.Value)})
	}
	return rec
}

// produceTo writes recs to topic, each to its own Partition.
func produceTo(ctx context.Context, t *testing.T, brokers []string, topic string, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
}

// oldestSetup starts a broker with a topic of the given partitions, and
// returns the config of a source on it with a group of its own, and a ctx
// for the test.
func oldestSetup(t *testing.T, partitions int32) ([]string, SourceConfig, context.Context) {
	t.Helper()
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, partitions)
	cfg.Group = uniq("ops")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return brokers, cfg, ctx
}

// wantOldest asks src for its oldest unread record and checks the answer.
func wantOldest(ctx context.Context, t *testing.T, src dlq.Ager, want time.Time, wantOK bool) {
	t.Helper()
	at, ok, err := src.Oldest(ctx)
	if err != nil || ok != wantOK || !at.Equal(want) {
		t.Fatalf("Oldest = %v, %v, %v; want %v, %v, nil", at, ok, err, want, wantOK)
	}
}

// TestOldestDeadLetter writes five dead letters over two partitions, the
// oldest not first in time order across them, and checks that Oldest
// answers the oldest one the group has not read, by its envelope: then the
// next one once the group committed past it, and nothing once it committed
// everything; a record without envelope counts by its timestamp.
func TestOldestDeadLetter(t *testing.T) {
	brokers, cfg, ctx := oldestSetup(t, 2)
	src := openSource(t, cfg)

	wantOldest(ctx, t, src, time.Time{}, false) // empty

	// Partition 0: minutes 0 and 3; partition 1: minutes 1, 2 and 4.
	produceTo(ctx, t, brokers, cfg.Topic,
		deadLetterAt("e0", 0, 0), deadLetterAt("e3", 0, 3),
		deadLetterAt("e1", 1, 1), deadLetterAt("e2", 1, 2), deadLetterAt("e4", 1, 4))
	wantOldest(ctx, t, src, oldestT0, true)

	// The group reads everything and settles e0 alone: its partition
	// commits past it, and the oldest unread is e1, on the other partition.
	got := map[string]*ackwise.Message{}
	buf := make([]*ackwise.Message, 5)
	for len(got) < 5 {
		n, err := src.Receive(ctx, buf)
		if err != nil {
			t.Fatalf("receive after %d: %v", len(got), err)
		}
		for _, m := range buf[:n] {
			got[m.ID] = m
		}
	}
	if err := src.Ack(ctx, got["e0"]); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 0, 1)
	wantOldest(ctx, t, src, oldestT0.Add(time.Minute), true)

	// e2 settled before e1: named in the commit metadata, not committed
	// past, so e1 stays the oldest. Then e1 settled: its partition commits
	// past both, and the oldest unread is e3 (minute 3), not e4 (minute 4).
	if err := src.Ack(ctx, got["e2"]); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "e2 named settled", func() bool {
		st := groupOffsetsOf(ctx, t, cfg)
		return st[1].Committed == 0 && st[1].Settled == 1
	})
	wantOldest(ctx, t, src, oldestT0.Add(time.Minute), true)
	if err := src.Ack(ctx, got["e1"]); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 1, 2)
	wantOldest(ctx, t, src, oldestT0.Add(3*time.Minute), true)

	for _, id := range []string{"e3", "e4"} {
		if err := src.Ack(ctx, got[id]); err != nil {
			t.Fatal(err)
		}
	}
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 0, 2)
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 1, 3)
	wantOldest(ctx, t, src, time.Time{}, false)

	// A record without envelope: its timestamp (milliseconds on the wire).
	ts := oldestT0.Add(-time.Hour)
	produceTo(ctx, t, brokers, cfg.Topic, &kgo.Record{Partition: 1, Value: []byte("raw"), Timestamp: ts})
	wantOldest(ctx, t, src, ts, true)
}

// TestOldestSkipsMarkers checks a partition whose committed offset holds
// no record a consumer sees: a transaction's marker is read past, and a
// backlog of nothing else answers none, at once rather than at ctx.
func TestOldestSkipsMarkers(t *testing.T) {
	brokers, cfg, ctx := oldestSetup(t, 1)

	// Offsets 0 and 1: a transaction's record and its marker; 2: e5.
	tx, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(cfg.Topic), kgo.TransactionalID(uniq("tx")))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	if err := tx.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := tx.ProduceSync(ctx, deadLetterAt("e0", 0, 0)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := tx.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	// The group settled e0: it committed offset 1, where the marker is.
	adm := kadm.NewClient(tx)
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: cfg.Topic, Partition: 0, At: 1, LeaderEpoch: -1})
	if err := adm.CommitAllOffsets(ctx, cfg.Group, offs); err != nil {
		t.Fatal(err)
	}
	src := openSource(t, cfg)
	if st := groupOffsetsOf(ctx, t, cfg); st[0].Committed != 1 || st[0].Lag() != 1 {
		t.Fatalf("after e0: %+v, want committed 1 and the marker in the backlog", st[0])
	}
	// Oldest reads past the marker to the end and finds nothing.
	wantOldest(ctx, t, src, time.Time{}, false)
	produceTo(ctx, t, brokers, cfg.Topic, deadLetterAt("e5", 0, 5))
	wantOldest(ctx, t, src, oldestT0.Add(5*time.Minute), true)
}

// groupOffsetsOf is GroupOffsets of cfg, failing t on an error.
func groupOffsetsOf(ctx context.Context, t *testing.T, cfg SourceConfig) []PartitionOffsets {
	t.Helper()
	st, err := GroupOffsets(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitFor polls cond until it holds, failing t when ctx ends first.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond) // the source commits every 20ms (testConfig)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// TestOldestDepthMetrics checks that dlq.NewDepthMetrics over a Kafka
// source reports ackwise.dlq.oldest.age from the source's Oldest.
func TestOldestDepthMetrics(t *testing.T) {
	brokers, cfg, ctx := oldestSetup(t, 2)
	produceTo(ctx, t, brokers, cfg.Topic, deadLetterAt("e2", 0, 2), deadLetterAt("e1", 1, 1), deadLetterAt("e3", 1, 3))
	src := openSource(t, cfg)

	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	clock := memory.NewVirtualClock(oldestT0.Add(time.Hour))
	dm, err := dlq.NewDepthMetrics(mp, src, dlq.DepthMetricsConfig{Destination: cfg.Topic, Oldest: src, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer dm.Close()
	got := gaugeValues(t, r)
	// The oldest, e1, failed at minute 1: 59 minutes before the clock.
	if got[dlq.MetricDepth] != 3 || got[dlq.MetricOldestAge] != 59*60 {
		t.Fatalf("gauges %v (err %v); want depth 3 and oldest age %d", got, dm.Err(), 59*60)
	}
}

// TestOldestBoundedByContext checks that Oldest gives up when ctx ends
// before the broker answers, naming the partitions it waited for, and
// refuses a consumer group among the Options rather than join it.
func TestOldestBoundedByContext(t *testing.T) {
	brokers, cfg, ctx := oldestSetup(t, 1)
	produceTo(ctx, t, brokers, cfg.Topic, deadLetterAt("e0", 0, 0))
	cfg = cfg.withDefaults() // as a Source holds it
	st := []standing{{PartitionOffsets: PartitionOffsets{Topic: cfg.Topic, End: 5, Committed: 1}}}
	// Offsets 1 to 4 do not exist yet: nothing comes below the end.
	short, stop := context.WithTimeout(ctx, 500*time.Millisecond)
	defer stop()
	_, _, err := firstUnread(short, cfg, st)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), cfg.Topic+"[0]") {
		t.Fatalf("Oldest past its ctx: %v", err)
	}
	grp := cfg
	grp.Options = []kgo.Opt{kgo.ConsumerGroup(cfg.Group)}
	if _, _, err := firstUnread(ctx, grp, st); err == nil || !strings.Contains(err.Error(), "group") {
		t.Fatalf("Oldest with a consumer group in Options: %v", err)
	}
}
