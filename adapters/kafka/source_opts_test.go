package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSourceRefusesWeakerOptions: retry moves and dead letters are produced
// with acks=all, confirmed before the offset is committed past (invariant
// 3); Config.Options that turn off idempotence or acks=all are refused by
// NewSource as by NewSink.
func TestSourceRefusesWeakerOptions(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	for name, opts := range map[string][]kgo.Opt{
		"idempotence off": {kgo.DisableIdempotentWrite()},
		"leader acks":     {kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())},
	} {
		cfg := Config{Brokers: brokers, Topic: uniq("t"), Group: "g", RetryTiers: []time.Duration{time.Minute}, Options: opts}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		src, err := NewSource(ctx, cfg)
		cancel()
		if err == nil {
			_ = src.Close()
			t.Errorf("%s: NewSource accepted it", name)
		}
	}
}
