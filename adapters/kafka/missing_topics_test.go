package kafka

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise/internal/logbuf"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSourceRefusesMissingRetryTopic: a source whose retry topic did not
// exist opened fine, and every retry move then failed: the record was
// handed back and delivered again at attempt 1, for ever, never
// dead-lettered. NewSource now refuses to open, naming the missing topic. A
// missing dead-letter topic is logged at Error instead (a source reading a
// dead-letter topic, as the CLI does, has none).
func TestSourceRefusesMissingRetryTopic(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	topic := uniq("t")
	if _, err := kadm.NewClient(cl).CreateTopics(ctx, 1, 1, nil, topic); err != nil { // the topic alone
		t.Fatal(err)
	}
	retryTopic, deadTopic := DefaultRetryTopic(topic, time.Second), topic+DefaultDeadLetterSuffix
	cfg := SourceConfig{ClientConfig: ClientConfig{Brokers: brokers}, Topic: topic, Group: topic + "-g", RetryTiers: []time.Duration{time.Second}}
	if _, err := NewSource(ctx, cfg); err == nil || !strings.Contains(err.Error(), "do not exist") || !strings.Contains(err.Error(), retryTopic) {
		t.Fatalf("NewSource without %s: %v, want an error naming it", retryTopic, err)
	}
	// Without tiers only the dead-letter topic is missing: logged.
	logs := &logbuf.Buffer{}
	plain := SourceConfig{ClientConfig: ClientConfig{Brokers: brokers, Logger: slog.New(slog.NewTextHandler(logs, nil))}, Topic: topic, Group: topic + "-p"}
	openSource(t, plain)
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), deadTopic) {
		t.Fatalf("no error logged for the missing dead-letter topic %s: %q", deadTopic, logs.String())
	}
	// Once the chain exists, the source opens.
	if err := CreateTopics(ctx, cfg, 1, 1); err != nil {
		t.Fatal(err)
	}
	openSource(t, cfg)
}
