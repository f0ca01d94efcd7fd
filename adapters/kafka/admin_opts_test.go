package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
)

// TestCreateTopicsUsesOptions: ClientConfig.Options may carry how to reach the
// brokers (a dialer, the authentication); NewSource and NewSink use them, so
// CreateTopics must too, or it cannot reach brokers the source and sink can.
func TestCreateTopicsUsesOptions(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("PLAIN", "ackwise", "pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg := SourceConfig{ClientConfig: ClientConfig{Brokers: c.ListenAddrs(), Options: []kgo.Opt{kgo.SASL(plain.Auth{User: "ackwise", Pass: "pw"}.AsMechanism())}}, Topic: uniq("t"), Group: "g", RetryTiers: []time.Duration{time.Minute}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := CreateTopics(ctx, cfg, 1, 1); err != nil {
		t.Fatalf("CreateTopics with the authentication in ClientConfig.Options: %v", err)
	}
	openSink(t, cfg)
}

// TestCreateTopicsMatchesExistingTopic: the retry and dead-letter topics get
// the partition count of the topic when it exists already, as documented,
// not the count passed for a topic CreateTopics would create.
func TestCreateTopicsMatchesExistingTopic(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	topic := uniq("t")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := CreateTopics(ctx, SourceConfig{ClientConfig: ClientConfig{Brokers: brokers}, Topic: topic}, 4, 1); err != nil {
		t.Fatal(err)
	}
	cfg := SourceConfig{ClientConfig: ClientConfig{Brokers: brokers}, Topic: topic, Group: "g", RetryTiers: []time.Duration{time.Minute}}
	if err := CreateTopics(ctx, cfg, 1, 1); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	details, err := kadm.NewClient(cl).ListTopics(ctx, cfg.Topics()...)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range cfg.Topics() {
		if n := len(details[name].Partitions); n != 4 {
			t.Errorf("topic %s has %d partitions, want the topic's 4", name, n)
		}
	}
}
