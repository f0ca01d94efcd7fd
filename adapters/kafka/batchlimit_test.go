package kafka

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSourcesBatchUnderMoveTopicLimits: the sources produce retry moves and
// dead letters with their own client, which batches each topic's records
// under that topic's max.message.bytes as the sink does: with a dead-letter
// topic (and a retry topic) limited to 2048 bytes, 40 records of a fifth of
// that produced together are all written, and a record over the limit fails
// alone. Before, franz-go batched them up to ~1 MB and the broker refused
// each whole batch.
func TestSourcesBatchUnderMoveTopicLimits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		tiers []time.Duration
		open  func(*testing.T, SourceConfig) *kgo.Client
	}{
		{"group", []time.Duration{time.Second}, func(t *testing.T, cfg SourceConfig) *kgo.Client { return openSource(t, cfg).Client() }},
		{"share", nil, func(t *testing.T, cfg SourceConfig) *kgo.Client { return openShare(t, cfg).Client() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			brokers := newCluster(t)
			cfg := testConfig(t, brokers, 1, tc.tiers...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			const limit = 2048
			d := cfg.withDefaults()
			moveTopics := append(d.retryTopics(), d.DeadLetterTopic)
			for _, topic := range moveTopics {
				setMaxMessageBytes(ctx, t, brokers, topic, limit)
			}
			cl := tc.open(t, cfg)
			for _, topic := range moveTopics {
				var recs []*kgo.Record
				for i := range 40 {
					recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("k"), Value: incompressible(limit / 10), Headers: []kgo.RecordHeader{{Key: "i", Value: []byte(strconv.Itoa(i))}}})
				}
				recs[20].Value = incompressible(limit + 1)
				for i, err := range produceConfirmed(ctx, cl, recs, nil) {
					switch {
					case i == 20 && !errors.Is(err, kerr.MessageTooLarge):
						t.Errorf("%s: the record over the limit: %v, want MESSAGE_TOO_LARGE", topic, err)
					case i != 20 && err != nil:
						t.Errorf("%s: record %d of a fifth of the limit: %v", topic, i, err)
					}
				}
			}
		})
	}
}
