package kafka

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestConsumersRefuseAutoCommitOptions: offsets are committed only for
// settled records (invariant 2). Options that turn franz-go's auto-commit on
// would commit polled records whatever became of them, and partition
// callbacks in a group source's Options would replace the ones that commit
// on revocation: every consuming constructor refuses them before it reaches
// a broker, with an error naming its config's Options and the option.
func TestConsumersRefuseAutoCommitOptions(t *testing.T) {
	t.Parallel()
	client := func(opts ...kgo.Opt) ClientConfig {
		return ClientConfig{Brokers: []string{"127.0.0.1:1"}, Options: opts} // never dialled
	}
	callback := func(context.Context, *kgo.Client, map[string][]int32) {}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // a broker dialled by mistake fails, not hangs
	defer cancel()
	open := map[string]func(ClientConfig) error{
		"SourceConfig": func(c ClientConfig) error {
			_, err := NewSource(ctx, SourceConfig{ClientConfig: c, Topic: "t", Group: "g"})
			return err
		},
		"TransactConfig": func(c ClientConfig) error {
			_, err := NewTransactSession(ctx, TransactConfig{ClientConfig: c, Topic: "t", Group: "g", TransactionalID: "x"})
			return err
		},
	}
	for cfg, open := range open {
		for name, opt := range map[string]kgo.Opt{
			"kgo.AutoCommitMarks":  kgo.AutoCommitMarks(),
			"kgo.GreedyAutoCommit": kgo.GreedyAutoCommit(),
		} {
			err := open(client(kgo.AutoCommitInterval(time.Second), opt))
			if err == nil || !strings.Contains(err.Error(), cfg+".Options turn auto-commit on ("+name+")") {
				t.Errorf("%s with %s: %v, want it refused naming both", cfg, name, err)
			}
		}
	}
	for name, opt := range map[string]kgo.Opt{
		"kgo.OnPartitionsAssigned": kgo.OnPartitionsAssigned(callback),
		"kgo.OnPartitionsRevoked":  kgo.OnPartitionsRevoked(callback),
		"kgo.OnPartitionsLost":     kgo.OnPartitionsLost(callback),
	} {
		err := open["SourceConfig"](client(opt))
		if err == nil || !strings.Contains(err.Error(), "SourceConfig.Options set what the source owns (partition callbacks") {
			t.Errorf("NewSource with %s: %v, want it refused", name, err)
		}
	}
	// A share group refuses them itself (franz-go), before any broker.
	for name, opt := range map[string]kgo.Opt{
		"kgo.AutoCommitMarks":     kgo.AutoCommitMarks(),
		"kgo.OnPartitionsRevoked": kgo.OnPartitionsRevoked(callback),
	} {
		_, err := NewShareSource(context.Background(), ShareConfig{ClientConfig: client(opt), Topic: "t", Group: "g"})
		if err == nil {
			t.Errorf("NewShareSource with %s: accepted", name)
		}
	}
}

// TestSourceTakesHarmlessOptions: options that leave commits to the source
// pass the check (auto-commit's interval is moot with auto-commit off).
func TestSourceTakesHarmlessOptions(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	cfg.Options = []kgo.Opt{kgo.AutoCommitInterval(time.Second), kgo.FetchMaxWait(time.Second)}
	src := openSource(t, cfg)
	if got, _ := src.Client().OptValue(kgo.FetchMaxWait).(time.Duration); got != time.Second {
		t.Fatalf("FetchMaxWait = %v, want the option's 1s", got)
	}
}
