package kafka

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSourceRefusesWeakerOptions: retry moves and dead letters are produced
// with acks=all, confirmed before the offset is committed past (invariant
// 3); SourceConfig.Options that turn off idempotence or acks=all are refused by
// NewSource as by NewSink.
func TestSourceRefusesWeakerOptions(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	for name, opts := range map[string][]kgo.Opt{
		"idempotence off": {kgo.DisableIdempotentWrite()},
		"leader acks":     {kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())},
	} {
		cfg := SourceConfig{ClientConfig: ClientConfig{Brokers: brokers, Options: opts}, Topic: uniq("t"), Group: "g", RetryTiers: []time.Duration{time.Minute}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		src, err := NewSource(ctx, cfg)
		cancel()
		if err == nil {
			_ = src.Close()
			t.Errorf("%s: NewSource accepted it", name)
		}
	}
}

// TestSourceRefusesRevokeTimeoutPastRebalanceTimeout: a revoke that waits
// for handlers as long as the group's rebalance timeout (franz-go's
// kgo.RebalanceTimeout, 60s by default) gets the member evicted from the
// group, its revoke commit refused, and what its handlers settled meanwhile
// redelivered. SourceConfig.RevokeTimeout documents that it must stay below the
// rebalance timeout; NewSource refuses a config that breaks that, naming
// the field, instead of accepting it silently.
func TestSourceRefusesRevokeTimeoutPastRebalanceTimeout(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	for name, c := range map[string]struct {
		revoke time.Duration
		opts   []kgo.Opt
	}{
		"default rebalance timeout": {revoke: 2 * time.Minute},
		"equal to it":               {revoke: time.Minute},
		"shorter rebalance timeout": {opts: []kgo.Opt{kgo.RebalanceTimeout(5 * time.Second)}}, // RevokeTimeout's default, 10s
	} {
		cfg := SourceConfig{ClientConfig: ClientConfig{Brokers: brokers, Options: c.opts}, Topic: uniq("t"), Group: "g", RevokeTimeout: c.revoke}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		src, err := NewSource(ctx, cfg)
		cancel()
		if err == nil {
			_ = src.Close()
			t.Errorf("%s: NewSource accepted RevokeTimeout %v (0: the default)", name, cfg.RevokeTimeout)
			continue
		}
		if !strings.Contains(err.Error(), "SourceConfig.RevokeTimeout") {
			t.Errorf("%s: error %q does not name SourceConfig.RevokeTimeout", name, err)
		}
	}
	// Below it, and -1 (no wait), are fine.
	for _, revoke := range []time.Duration{-1, 30 * time.Second} {
		cfg := testConfig(t, brokers, 1)
		cfg.RevokeTimeout = revoke
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		src, err := NewSource(ctx, cfg)
		cancel()
		if err != nil {
			t.Errorf("RevokeTimeout %v: %v", revoke, err)
			continue
		}
		_ = src.Close()
	}
}
