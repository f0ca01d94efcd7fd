package sqs

import (
	"context"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
)

// TestHeartbeatKeepsMessage: a handler running three times the visibility
// timeout keeps its message: the engine extends the lease (batched
// ChangeMessageVisibility), so a second consumer polling the queue all
// along never gets it, and once acked it never comes back.
func TestHeartbeatKeepsMessage(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	c := testClient(t)
	conn := testConn(t)
	q := createQueue(t, c, "heartbeat", lease, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sink, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: conn})
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Publish(ctx, &ackwise.Message{ID: "slow", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	open := func() *Source {
		src, err := NewSource(ctx, Config{QueueURL: q, Connection: conn, WaitTime: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close() })
		return src
	}
	first := open()
	if got := first.Capabilities().Lease; got != lease {
		t.Fatalf("Lease %v, want the queue's %v", got, lease)
	}
	started, finished := make(chan struct{}), make(chan struct{})
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
		close(started)
		defer close(finished)
		select {
		case <-time.After(3 * lease): // the slow work
		case <-ctx.Done():
		}
		return nil
	})
	cons, err := consumer.New(first, h, consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cons.Run(runCtx) }()
	<-started

	// A second consumer polls while the handler runs, and a lease and a
	// half after it finished.
	second := open()
	wait, cancelWait := context.WithTimeout(ctx, 3*lease+lease*3/2)
	defer cancelWait()
	buf := make([]*ackwise.Message, 1)
	if n, _ := second.Receive(wait, buf); n > 0 {
		select {
		case <-finished:
			t.Fatalf("%s (attempt %d) delivered again after its handler finished: the ack was lost", buf[0].ID, buf[0].Attempt)
		default:
			t.Fatalf("%s (attempt %d) delivered to a second consumer while its handler ran: the lease was not extended", buf[0].ID, buf[0].Attempt)
		}
	}
	<-finished
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if st := cons.Stats(); st.Acked != 1 {
		t.Fatalf("stats %+v, want 1 acked", st)
	}
}
