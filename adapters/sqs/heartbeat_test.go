package sqs

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/meminbox"
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

// noHeartbeat is a Source whose Capabilities deny ExtendLease: the engine
// then never extends a lease.
type noHeartbeat struct{ *Source }

func (s noHeartbeat) Capabilities() adapters.Capabilities {
	c := s.Source.Capabilities()
	c.ExtendLease = false
	return c
}

// TestNoHeartbeatInboxAbsorbsDuplicate: without the heartbeat, a handler
// running three times the visibility timeout loses its message to a
// second consumer when the lease ends (SQS redelivers it); the inbox both
// consumers share (meminbox) holds the second delivery until the first
// run committed, then acknowledges it without running the handler: the
// effect happens once, the duplicate is counted, and the queue ends empty.
func TestNoHeartbeatInboxAbsorbsDuplicate(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	c := testClient(t)
	conn := testConn(t)
	q := createQueue(t, c, "noheartbeat", lease, false)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sink, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: conn})
	if err != nil {
		t.Fatal(err)
	}
	id := "slow-" + randSuffix()
	if err := sink.Publish(ctx, &ackwise.Message{ID: id, Payload: []byte("top-up 5")}); err != nil {
		t.Fatal(err)
	}
	store := meminbox.New(nil)
	var effects, duplicates atomic.Int64
	inbox, err := middleware.Inbox(store, middleware.InboxConfig{Consumer: "billing", OnDuplicate: func(context.Context, *ackwise.Message) { duplicates.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
		effects.Add(1)
		select {
		case <-time.After(3 * lease): // the slow work
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	runCtx, stop := context.WithCancel(ctx)
	var runs []chan error
	var sources []*Source
	for range 2 {
		src, err := NewSource(ctx, Config{QueueURL: q, Connection: conn, WaitTime: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close() })
		sources = append(sources, src)
		cons, err := consumer.New(noHeartbeat{src}, h, consumer.Config{Name: "billing", Inbox: inbox})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cons.Run(runCtx) }()
		runs = append(runs, done)
	}
	// A queue offers nothing to wait on: poll until the message is gone.
	for {
		n, err := sources[0].Backlog(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 && duplicates.Load() > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("backlog %d, %d duplicates absorbed, %d runs of the handler", n, duplicates.Load(), effects.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	for _, done := range runs {
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	if n := effects.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want once: the inbox let a duplicate through", n)
	}
	if !store.Handled(middleware.InboxKey{Consumer: "billing", EventID: id}) {
		t.Fatal("the inbox holds no record of the event")
	}
}
