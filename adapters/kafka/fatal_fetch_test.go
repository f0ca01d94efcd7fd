package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/ackwise/ackwise"
)

// TestReceiveReturnsFatalFetchError: a fetch error retrying will not cure
// (here: the user may join the group and describe the topic, not read it)
// is returned by Receive. Before, Receive logged it at Warn (the default
// Logger discards) and waited for ever without a word.
func TestReceiveReturnsFatalFetchError(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := unreadableTopic(ctx, t)
	src := openSource(t, cfg)
	buf := make([]*ackwise.Message, 1)
	n, err := src.Receive(ctx, buf)
	if n != 0 || err == nil || ctx.Err() != nil {
		t.Fatalf("Receive without read permission = %d, %v (context: %v), want the fetch's error", n, err, ctx.Err())
	}
	t.Logf("Receive: %v", err)
	if kerr.IsRetriable(err) {
		t.Fatalf("Receive returned a retriable error: %v", err)
	}
}

// unreadableTopic starts a kfake broker with ACLs and a topic holding one
// record, and returns a SourceConfig (with a group) for a user who may join the
// group, describe the topic and use a transactional ID, but not read the
// topic.
func unreadableTopic(ctx context.Context, t *testing.T) SourceConfig {
	t.Helper()
	any := func(rt kmsg.ACLResourceType, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: rt, Name: "*", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser("PLAIN", "admin", "admin-pw"),
		kfake.User("PLAIN", "reader", "reader-pw",
			any(kmsg.ACLResourceTypeGroup, kmsg.ACLOperationRead),
			any(kmsg.ACLResourceTypeTopic, kmsg.ACLOperationDescribe),
			any(kmsg.ACLResourceTypeTransactionalId, kmsg.ACLOperationWrite),
			any(kmsg.ACLResourceTypeTransactionalId, kmsg.ACLOperationDescribe)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	admin := SourceConfig{ClientConfig: ClientConfig{Brokers: c.ListenAddrs(), SASL: plain.Auth{User: "admin", Pass: "admin-pw"}.AsMechanism()}, Topic: uniq("t")}
	if err := CreateTopics(ctx, admin, 1, 1); err != nil {
		t.Fatal(err)
	}
	publishN(t, openSink(t, admin), 1, func(int) string { return "k" })
	cfg := admin
	cfg.Group = cfg.Topic + "-g"
	cfg.SASL = plain.Auth{User: "reader", Pass: "reader-pw"}.AsMechanism()
	return cfg
}
