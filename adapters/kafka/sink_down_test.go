package kafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// TestSinkPublishReturnsWhenBrokerDown: Publish returns ctx's error when
// ctx ends before the broker confirms. Before, with the broker gone, it
// blocked for as long as franz-go retried (for ever, with idempotent
// writes), whatever ctx said: a redrive into a target that went down hung.
func TestSinkPublishReturnsWhenBrokerDown(t *testing.T) {
	t.Parallel()
	sink := sinkBrokerGone(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- sink.Publish(ctx, &ackwise.Message{ID: "b", Payload: []byte("y")}) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Publish to a broker that is gone = %v, want the context's deadline", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Publish to a broker that is gone, with a 1s context, still blocked after 20s")
	}
}

// sinkBrokerGone opens a sink with opts on a kfake broker of its own,
// publishes one record ("a"), and stops the broker. The sink's client is
// closed when the test ends (not the sink: its Close waits to flush to a
// broker that is gone).
func sinkBrokerGone(t *testing.T, opts ...kgo.Opt) *Sink {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	cfg := SourceConfig{ClientConfig: ClientConfig{Brokers: c.ListenAddrs(), Options: opts}, Topic: uniq("t")}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := CreateTopics(ctx, cfg, 1, 1); err != nil {
		t.Fatal(err)
	}
	sink, err := NewSink(ctx, sinkOf(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sink.Client().Close) // also unblocks a Publish or a Close a bug left hanging
	if err := sink.Publish(ctx, &ackwise.Message{ID: "a", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	return sink
}

// TestSinkRefusesWeakerOptions: ClientConfig.Options are applied after the sink's
// own, so they could turn off idempotent writes or acks=all; the sink
// refuses them instead of publishing with weaker guarantees than it
// documents.
func TestSinkRefusesWeakerOptions(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	for name, opts := range map[string][]kgo.Opt{
		"idempotence off": {kgo.DisableIdempotentWrite()},
		"leader acks":     {kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())},
	} {
		cfg := SourceConfig{ClientConfig: ClientConfig{Brokers: brokers, Options: opts}, Topic: uniq("t")}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		sink, err := NewSink(ctx, sinkOf(cfg))
		cancel()
		if err == nil {
			_ = sink.Close()
			t.Errorf("%s: NewSink accepted it", name)
		}
	}
}

// TestSinkTooLargeIsPermanent: a record the client can never produce (here
// larger than a batch may be) fails with a permanent error, so a retrying
// publisher gives up at once instead of after every attempt.
func TestSinkTooLargeIsPermanent(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := SourceConfig{ClientConfig: ClientConfig{Brokers: brokers}, Topic: uniq("t")}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := CreateTopics(ctx, cfg, 1, 1); err != nil {
		t.Fatal(err)
	}
	sink := openSink(t, cfg)
	err := sink.Publish(ctx, &ackwise.Message{ID: "big", Payload: make([]byte, 2<<20)})
	if err == nil {
		t.Fatal("a 2 MiB record was accepted")
	}
	if c := ackwise.ClassOf(err); c != ackwise.ClassPermanent {
		t.Fatalf("Publish of a record too large = %v, classified %v, want permanent", err, c)
	}
}
