package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// TestSinkCloseBoundedWhilePublishWaits: Close flushes for at most its
// flush timeout, then closes the client, which fails the records still
// unconfirmed, so a Publish waiting on them returns an error. Before, Close
// first waited for every Publish in flight to return (Publish held the
// sink's read lock while it awaited confirms): with the broker gone and a
// Publish whose ctx has no deadline (franz-go retries an idempotent record
// for ever), Close never returned, and neither did the Publish.
func TestSinkCloseBoundedWhilePublishWaits(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	buffered := make(chan struct{}, 2)
	cfg := Config{Brokers: c.ListenAddrs(), Topic: uniq("t"), Options: []kgo.Opt{kgo.WithHooks(bufferedHook(buffered))}}
	ctx0, cancel0 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel0()
	if err := CreateTopics(ctx0, cfg, 1, 1); err != nil {
		t.Fatal(err)
	}
	sink, err := NewSink(ctx0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sink.Client().Close) // unblocks a Publish and a Close the bug left hanging
	sink.closeFlushTimeout = 100 * time.Millisecond
	if err := sink.Publish(ctx0, &ackwise.Message{ID: "a", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	<-buffered
	c.Close()

	published := make(chan error, 1)
	go func() {
		published <- sink.Publish(context.Background(), &ackwise.Message{ID: "b", Payload: []byte("y")})
	}()
	// The record is buffered once Publish handed it to the client: Publish
	// is then waiting for its confirm.
	select {
	case <-buffered:
	case err := <-published:
		t.Fatalf("Publish to a broker that is gone returned %v before Close", err)
	case <-ctx0.Done():
		t.Fatal("the record was never buffered")
	}
	closed := make(chan error, 1)
	go func() { closed <- sink.Close() }()
	select {
	case err := <-closed:
		if err == nil {
			t.Error("Close reported a clean flush, but a record was never confirmed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close still blocked after 10s (flush timeout 100ms) behind a Publish awaiting a broker that is gone")
	}
	select {
	case err := <-published:
		if err == nil {
			t.Fatal("Publish of a record the broker never confirmed returned nil")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Publish still blocked 10s after Close")
	}
}

// bufferedHook signals on ch each record the client buffered.
type bufferedHook chan struct{}

func (h bufferedHook) OnProduceRecordBuffered(*kgo.Record) { h <- struct{}{} }
