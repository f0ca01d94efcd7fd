package kafka_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/adaptertest"
	"github.com/ackwise/ackwise/adapters/kafka"
	"github.com/twmb/franz-go/pkg/kfake"
)

func TestConformance(t *testing.T) {
	t.Parallel() // a broker of its own; the suite mostly waits
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	adaptertest.Run(t, adaptertest.Harness{Open: func(t testing.TB, fc adaptertest.FixtureConfig) adaptertest.Fixture {
		topic := kafka.NewTopicName(t)
		cfg := kafka.SourceConfig{ClientConfig: kafka.ClientConfig{Brokers: brokers}, Topic: topic, Group: topic + "-g", RetryTiers: fc.DelayTiers}
		parts := int32(fc.Partitions)
		if parts == 0 {
			parts = 1
		}
		ctx := context.Background()
		if err := kafka.CreateTopics(ctx, cfg, parts, 1); err != nil {
			t.Fatal(err)
		}
		sink, err := kafka.NewSink(ctx, kafka.SinkConfig{ClientConfig: cfg.ClientConfig, Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sink.Close() })
		newSource := func(t testing.TB) adapters.Source {
			src, err := kafka.NewSource(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = src.Close() })
			return src
		}
		return adaptertest.Fixture{
			Sink:      sink,
			NewSource: newSource,
			DeadLetters: func(ctx context.Context, t testing.TB) []*ackwise.Message {
				return kafka.ReadTopicForTest(ctx, t, brokers, topic+kafka.DefaultDeadLetterSuffix)
			},
			Refuse: refuseTooLarge,
			// A member joining the group: the rebalance revokes a
			// partition of the others.
			Invalidate: func(t testing.TB, _ adapters.Source) { newSource(t) },
		}
	}})
}

// TestConformanceShareGroup runs the suite on a share-group source.
// shareLease is the share conformance broker's record lock.
const shareLease = 2 * time.Second

func TestConformanceShareGroup(t *testing.T) {
	t.Parallel() // a broker of its own; the suite mostly waits
	// Records are locked for shareLease (the lease the suite's lease case
	// asks for; kfake locks for the broker's setting whatever the group's
	// says, unlike Kafka), and expired locks are swept every 100ms, so a
	// lease runs out when it says.
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.BrokerConfigs(map[string]string{
		"group.share.record.lock.duration.ms": strconv.FormatInt(shareLease.Milliseconds(), 10),
		"share.record.lock.sweep.interval.ms": "100",
	}))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	adaptertest.Run(t, adaptertest.Harness{Open: func(t testing.TB, fc adaptertest.FixtureConfig) adaptertest.Fixture {
		topic := kafka.NewTopicName(t)
		cfg := kafka.SourceConfig{ClientConfig: kafka.ClientConfig{Brokers: brokers}, Topic: topic, Group: topic + "-g"}
		parts := int32(fc.Partitions)
		if parts == 0 {
			parts = 1
		}
		ctx := context.Background()
		if err := kafka.CreateTopics(ctx, cfg, parts, 1); err != nil {
			t.Fatal(err)
		}
		sink, err := kafka.NewSink(ctx, kafka.SinkConfig{ClientConfig: cfg.ClientConfig, Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sink.Close() })
		return adaptertest.Fixture{
			Sink: sink,
			NewSource: func(t testing.TB) adapters.Source {
				src, err := kafka.NewShareSource(ctx, kafka.ShareConfig{ClientConfig: cfg.ClientConfig, Topic: topic, Group: cfg.Group})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = src.Close() })
				return src
			},
			DeadLetters: func(ctx context.Context, t testing.TB) []*ackwise.Message {
				return kafka.ReadTopicForTest(ctx, t, brokers, topic+kafka.DefaultDeadLetterSuffix)
			},
			Refuse: refuseTooLarge,
		}
	}})
}

// refuseTooLarge makes msg larger than a record batch may be (franz-go's
// ProducerBatchMaxBytes, 1MB by default, below kfake's max.message.bytes),
// so that it fails alone, as MESSAGE_TOO_LARGE. A record the broker refuses
// fails its whole partition batch: see TestSinkReportsRecordTooLarge.
func refuseTooLarge(_ testing.TB, msg *ackwise.Message) {
	msg.Payload = make([]byte, 1<<20)
}
