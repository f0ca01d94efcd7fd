package gcppubsub

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/ackwise/ackwise"
)

const testProject = "ackwise-test"

// fake is one in-process Pub/Sub (pstest) and an admin client on it.
type fake struct {
	srv   *pstest.Server
	admin *pubsub.Client
	mu    sync.Mutex
	dead  map[string][]*ackwise.Message // dead-letter subscription → pulled so far
}

// newFake starts pstest with opts (reactors: injected errors).
func newFake(t testing.TB, opts ...pstest.ServerReactorOption) *fake {
	t.Helper()
	srv := pstest.NewServer(opts...)
	t.Cleanup(func() { srv.Close() })
	admin, err := newClient(context.Background(), testProject, "", srv.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	return &fake{srv: srv, admin: admin, dead: map[string][]*ackwise.Message{}}
}

func randSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// names of one test destination.
type dest struct {
	topic, sub, dlTopic, dlSub string // IDs
}

func (d dest) sourceConfig(f *fake) Config {
	return Config{Project: testProject, Subscription: d.sub, DeadLetterTopic: d.dlTopic, Emulator: f.srv.Addr, MaxOutstandingMessages: 20, AckDeadline: 10 * time.Second}
}

func (d dest) sinkConfig(f *fake) SinkConfig {
	return SinkConfig{Project: testProject, Topic: d.topic, Emulator: f.srv.Addr}
}

// create makes a topic, its subscription shaped by shape, a dead-letter
// topic and a subscription on it.
func (f *fake) create(t testing.TB, shape func(*pubsubpb.Subscription)) dest {
	t.Helper()
	s := randSuffix()
	d := dest{topic: "t-" + s, sub: "s-" + s, dlTopic: "dlt-" + s, dlSub: "dls-" + s}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, topic := range []string{d.topic, d.dlTopic} {
		if _, err := f.admin.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + testProject + "/topics/" + topic}); err != nil {
			t.Fatal(err)
		}
	}
	ps := &pubsubpb.Subscription{Name: "projects/" + testProject + "/subscriptions/" + d.sub, Topic: "projects/" + testProject + "/topics/" + d.topic, AckDeadlineSeconds: 10}
	if shape != nil {
		shape(ps)
	}
	dl := &pubsubpb.Subscription{Name: "projects/" + testProject + "/subscriptions/" + d.dlSub, Topic: "projects/" + testProject + "/topics/" + d.dlTopic, AckDeadlineSeconds: 10}
	for _, sub := range []*pubsubpb.Subscription{ps, dl} {
		if _, err := f.admin.SubscriptionAdminClient.CreateSubscription(ctx, sub); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// deadLetters pulls what reached d's dead-letter subscription since the
// last call, acks it, and returns everything pulled so far.
func (f *fake) deadLetters(ctx context.Context, t testing.TB, d dest) []*ackwise.Message {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	name := "projects/" + testProject + "/subscriptions/" + d.dlSub
	resp, err := f.admin.SubscriptionAdminClient.Pull(ctx, &pubsubpb.PullRequest{Subscription: name, MaxMessages: 100, ReturnImmediately: true})
	if err != nil {
		t.Fatalf("pull dead letters: %v", err)
	}
	var ackIDs []string
	for _, rm := range resp.GetReceivedMessages() {
		ackIDs = append(ackIDs, rm.GetAckId())
		m := rm.GetMessage()
		var hs ackwise.Headers
		for k, v := range m.GetAttributes() {
			hs = append(hs, ackwise.Header{Key: k, Value: v})
		}
		f.dead[d.dlSub] = append(f.dead[d.dlSub], &ackwise.Message{
			ID: hs.Get(ackwise.HeaderEventID), Key: hs.Get(HeaderKey), Payload: m.GetData(), Headers: hs,
			BrokerID: m.GetMessageId(), Partition: -1, Offset: -1,
		})
	}
	if len(ackIDs) > 0 {
		if err := f.admin.SubscriptionAdminClient.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: name, AckIds: ackIDs}); err != nil {
			t.Fatalf("ack dead letters: %v", err)
		}
	}
	return append([]*ackwise.Message(nil), f.dead[d.dlSub]...)
}

// awaitDeadLetters polls d's dead-letter subscription until it held n
// dead letters, and returns them; it fails t when ctx ends first.
func (f *fake) awaitDeadLetters(ctx context.Context, t testing.TB, d dest, n int) []*ackwise.Message {
	t.Helper()
	for {
		if dl := f.deadLetters(ctx, t, d); len(dl) >= n {
			return dl
		}
		select {
		case <-ctx.Done():
			t.Fatalf("fewer than %d dead letters on %s", n, d.dlSub)
		case <-time.After(20 * time.Millisecond): // the topic has no notification to await
		}
	}
}

// testLogger logs through t.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, nil))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
