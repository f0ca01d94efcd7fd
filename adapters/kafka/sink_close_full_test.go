package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// TestSinkCloseBoundedWhileProduceBlocks: a Publish whose records do not fit
// in the client's buffer (kgo.MaxBufferedRecords, 10000 by default) blocks
// in the client's Produce until confirms make room; with the broker gone
// that is never. Close still returns after its flush timeout, and the
// Publish then returns an error. Before, Publish held the sink's read lock
// while it handed records to the client, so Close waited for the blocked
// Produce (for as long as the Publish's ctx lasted: for ever with none),
// and both hung.
func TestSinkCloseBoundedWhileProduceBlocks(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	buffered := make(chan struct{}, 3)
	cfg := Config{Brokers: c.ListenAddrs(), Topic: uniq("t"), Options: []kgo.Opt{
		kgo.WithHooks(bufferedHook(buffered)),
		kgo.MaxBufferedRecords(1),
	}}
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
		published <- sink.Publish(context.Background(),
			&ackwise.Message{ID: "b", Payload: []byte("y")},
			&ackwise.Message{ID: "c", Payload: []byte("z")})
	}()
	// The hook runs as Produce starts on a record: once it ran for "c",
	// "b" fills the buffer and Produce of "c" blocks for room.
	for i := 0; i < 2; i++ {
		select {
		case <-buffered:
		case err := <-published:
			t.Fatalf("Publish to a broker that is gone returned %v before Close", err)
		case <-ctx0.Done():
			t.Fatal("the records were never handed to the client")
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- sink.Close() }()
	select {
	case err := <-closed:
		if err == nil {
			t.Error("Close reported a clean flush, but records were never confirmed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close still blocked after 10s (flush timeout 100ms) behind a Publish blocked in Produce on a full buffer")
	}
	select {
	case err := <-published:
		if err == nil {
			t.Fatal("Publish of records the broker never confirmed returned nil")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Publish still blocked 10s after Close")
	}
}
