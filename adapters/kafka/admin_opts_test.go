package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
)

// TestCreateTopicsUsesOptions: Config.Options may carry how to reach the
// brokers (a dialer, the authentication); NewSource and NewSink use them, so
// CreateTopics must too, or it cannot reach brokers the source and sink can.
func TestCreateTopicsUsesOptions(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("PLAIN", "ackwise", "pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg := Config{Brokers: c.ListenAddrs(), Topic: uniq("t"), Group: "g", RetryTiers: []time.Duration{time.Minute},
		Options: []kgo.Opt{kgo.SASL(plain.Auth{User: "ackwise", Pass: "pw"}.AsMechanism())}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := CreateTopics(ctx, cfg, 1, 1); err != nil {
		t.Fatalf("CreateTopics with the authentication in Config.Options: %v", err)
	}
	openSink(t, cfg)
}
