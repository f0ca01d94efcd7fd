package kafka

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// newCluster starts an in-process kfake cluster for the test.
func newCluster(t testing.TB) []string {
	t.Helper()
	return newKfake(t).ListenAddrs()
}

// newKfake is newCluster's broker itself, for tests that observe or hold
// its requests (ControlKey).
func newKfake(t testing.TB) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func uniq(prefix string) string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// testConfig returns a config on fresh topics, created on the cluster.
func testConfig(t testing.TB, brokers []string, partitions int32, tiers ...time.Duration) SourceConfig {
	t.Helper()
	topic := uniq("t")
	cfg := SourceConfig{ClientConfig: ClientConfig{Brokers: brokers}, Topic: topic, Group: topic + "-g", RetryTiers: tiers, CommitInterval: 20 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := CreateTopics(ctx, cfg, partitions, 1); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func openSource(t testing.TB, cfg SourceConfig) *Source {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := NewSource(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// sinkOf, shareOf and txnOf are the configs of a sink, a share source and a
// transact session on the topic (and the group) of a source's cfg, with
// its client settings.
func sinkOf(cfg SourceConfig) SinkConfig {
	return SinkConfig{ClientConfig: cfg.ClientConfig, Topic: cfg.Topic}
}

func shareOf(cfg SourceConfig) ShareConfig {
	return ShareConfig{ClientConfig: cfg.ClientConfig, Topic: cfg.Topic, Group: cfg.Group, DeadLetterTopic: cfg.DeadLetterTopic,
		PollBatch: cfg.PollBatch, FetchMaxBytes: cfg.FetchMaxBytes, FetchMaxPartitionBytes: cfg.FetchMaxPartitionBytes, StartOffset: cfg.StartOffset}
}

func txnOf(cfg SourceConfig) TransactConfig {
	return TransactConfig{ClientConfig: cfg.ClientConfig, Topic: cfg.Topic, Group: cfg.Group, TransactionalID: cfg.Topic + "-tx",
		PollBatch: cfg.PollBatch, FetchMaxBytes: cfg.FetchMaxBytes, FetchMaxPartitionBytes: cfg.FetchMaxPartitionBytes, StartOffset: cfg.StartOffset}
}

// openSink opens a sink on cfg's topic.
func openSink(t testing.TB, cfg SourceConfig) *Sink {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := NewSink(ctx, sinkOf(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// readAll reads every record of topic up to its current end, with a client
// outside any group, configured further by opts. Each offset below the end
// must hold a record (no transaction markers: see readIsolated).
func readAll(ctx context.Context, t testing.TB, brokers []string, topic string, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("list end offsets of %s: %v", topic, err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	var out []*kgo.Record
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %s: %v (still waiting for %v)", topic, err, want)
		}
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				t.Logf("read %s: %v", topic, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			out = append(out, r)
			if end, ok := want[r.Partition]; ok && r.Offset+1 >= end {
				delete(want, r.Partition)
			}
		})
	}
	return out
}

// recordMessage converts a raw record for assertions.
func recordMessage(r *kgo.Record) *ackwise.Message {
	m := &ackwise.Message{Key: string(r.Key), Payload: r.Value, Source: r.Topic, Partition: r.Partition, Offset: r.Offset, Headers: ackwise.Headers{}}
	for _, h := range r.Headers {
		m.Headers.Set(h.Key, string(h.Value))
	}
	m.ID = m.Headers.Get(ackwise.HeaderEventID)
	return m
}

// committed returns the group's committed offset of topic/partition, or -1.
func committed(ctx context.Context, t testing.TB, brokers []string, group, topic string, partition int32) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("fetch offsets of %s: %v", group, err)
	}
	o, ok := offs.Lookup(topic, partition)
	if !ok {
		return -1
	}
	return o.At
}
