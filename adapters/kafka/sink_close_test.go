package kafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// TestSinkCloseBounded: with the broker gone, Close flushes for at most its
// flush timeout, then closes the client, which fails the records still
// unconfirmed, so a Publish in flight returns an error, wherever it waits:
//   - awaiting the confirms of records it handed to the client. Before,
//     Close first waited for every Publish in flight to return (Publish held
//     the sink's read lock while it awaited confirms); franz-go retries an
//     idempotent record for ever, so with a Publish whose ctx has no
//     deadline, Close never returned, and neither did the Publish.
//   - blocked in the client's Produce, its records not fitting in the
//     client's buffer (kgo.MaxBufferedRecords, 10000 by default) until
//     confirms make room: never, with the broker gone. Before, Publish held
//     the read lock while it handed records to the client, and both hung.
func TestSinkCloseBounded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts []kgo.Opt
		msgs []*ackwise.Message // published once the broker is gone
	}{
		{"awaiting confirms", nil, []*ackwise.Message{{ID: "b", Payload: []byte("y")}}},
		// Once Produce started on "c", "b" fills the buffer and Produce of
		// "c" blocks for room.
		{"blocked in Produce", []kgo.Opt{kgo.MaxBufferedRecords(1)}, []*ackwise.Message{{ID: "b", Payload: []byte("y")}, {ID: "c", Payload: []byte("z")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			buffered := make(chan struct{}, 3)
			sink := sinkBrokerGone(t, append([]kgo.Opt{kgo.WithHooks(bufferedHook(buffered))}, tc.opts...)...)
			<-buffered // "a"
			sink.closeFlushTimeout = 100 * time.Millisecond
			ctx0, cancel0 := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel0()

			published := make(chan error, 1)
			go func() { published <- sink.Publish(context.Background(), tc.msgs...) }()
			// The hook runs as Produce takes a record: once it ran for
			// each, Publish waits for confirms, or for room in the buffer.
			for range tc.msgs {
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
				t.Fatal("Close still blocked after 10s (flush timeout 100ms) behind a Publish")
			}
			select {
			case err := <-published:
				if err == nil {
					t.Fatal("Publish of records the broker never confirmed returned nil")
				}
				// A retrying caller (producer.Publisher) stops at once.
				if !errors.Is(err, adapters.ErrClosed) {
					t.Errorf("Publish = %v, want adapters.ErrClosed: the sink was closed", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Publish still blocked 10s after Close")
			}
		})
	}
}

// bufferedHook signals on ch each record the client buffered.
type bufferedHook chan struct{}

func (h bufferedHook) OnProduceRecordBuffered(*kgo.Record) { h <- struct{}{} }
