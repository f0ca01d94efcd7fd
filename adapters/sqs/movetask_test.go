package sqs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// TestMoveTask: 300 dead letters (written by DeadLetter, ackwise-managed,
// into a queue that the work queue's RedrivePolicy names, as SQS requires
// of a move task's source) are moved back by SQS's move task at a cap of
// 100 a second: the task reports the cap and 300 moved, takes at least the
// 2 s the cap allows, and each event arrives on the work queue once, its
// body and attributes as they were in the dead-letter queue (the envelope
// included: SQS moves messages as they are).
func TestMoveTask(t *testing.T) {
	t.Parallel()
	const n, rate = 300, 100
	c := testClient(t)
	conn := testConn(t)
	q := createQueue(t, c, "move", 0, false)
	dq := createQueue(t, c, "move-dlq", 0, false)
	setRedrivePolicy(t, c, q, dq, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sink, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: conn})
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]*ackwise.Message, n)
	for i := range msgs {
		msgs[i] = &ackwise.Message{ID: fmt.Sprint("e", i), Key: fmt.Sprint("k", i%7), Payload: []byte(fmt.Sprintf(`{"top-up":%d}`, i)), Headers: ackwise.HeadersOf("x-tenant", "acme")}
	}
	if err := sink.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(ctx, Config{QueueURL: q, DeadLetterQueueURL: dq, Connection: conn, WaitTime: -1, MaxAttempts: 10})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]*ackwise.Message, 10)
	for done := 0; done < n; {
		k, err := src.Receive(ctx, buf)
		if err != nil {
			t.Fatalf("after %d dead letters: %v", done, err)
		}
		for _, m := range buf[:k] {
			env := dlq.New(m, dlq.ReasonPermanent, errors.New("bad input"), ackwise.ClassPermanent, time.Now(), "billing", "v1")
			if err := src.DeadLetter(ctx, m, env); err != nil {
				t.Fatal(err)
			}
		}
		done += k
	}
	src.Close()

	var reads int
	res, err := MoveTask(ctx, conn, dq, q, MoveOptions{MaxPerSecond: rate, Poll: 200 * time.Millisecond, Progress: func(MoveResult) { reads++ }})
	if err != nil {
		t.Fatalf("MoveTask: %v (%+v)", err, res)
	}
	// At 100 a second, 300 take at least 2 s however SQS spreads them
	// over the seconds; a busy machine only makes it longer.
	if res.Status != MoveCompleted || res.Moved != n || res.ToMove != n || res.MaxPerSecond != rate || res.Elapsed < 2*time.Second || reads == 0 {
		t.Fatalf("MoveTask = %+v after %d progress reads; want %s, %d of %d moved at %d/s in at least 2s", res, reads, MoveCompleted, n, n, rate)
	}

	back, err := NewSource(ctx, Config{QueueURL: q, Connection: conn, WaitTime: -1, AckLinger: -1, DeadLetterQueueURL: dq, MaxAttempts: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	seen := map[string]bool{}
	for len(seen) < n {
		k, err := back.Receive(ctx, buf)
		if err != nil {
			t.Fatalf("after %d of the moved events: %v", len(seen), err)
		}
		for _, m := range buf[:k] {
			var i int
			if _, err := fmt.Sscanf(m.ID, "e%d", &i); err != nil || seen[m.ID] {
				t.Fatalf("moved %q: seen before %v (%v)", m.ID, seen[m.ID], err)
			}
			want := msgs[i]
			env, err := dlq.Decode(m.Headers)
			switch {
			case string(m.Payload) != string(want.Payload) || m.Key != want.Key || m.Headers.Get("x-tenant") != "acme":
				t.Fatalf("moved %s: payload %q key %q headers %v, want %q %q with x-tenant", m.ID, m.Payload, m.Key, m.Headers, want.Payload, want.Key)
			case err != nil || env.Reason != dlq.ReasonPermanent || env.Consumer != "billing" || env.Source != queueName(q):
				t.Fatalf("moved %s: envelope %+v (%v), want the dead letter's", m.ID, env, err)
			}
			seen[m.ID] = true
			if err := back.Ack(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, qu := range []string{q, dq} {
		if k, err := (&Source{client: c, queueURL: qu, name: queueName(qu)}).Backlog(ctx); err != nil || k != 0 {
			t.Errorf("%s holds %d messages (%v) after the move, want 0", queueName(qu), k, err)
		}
	}
}

// TestMoveTaskRefusals: a move SQS could not make is refused before or
// by StartMessageMoveTask, saying why.
func TestMoveTaskRefusals(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	conn := testConn(t)
	q := createQueue(t, c, "refuse", 0, false)
	plain := createQueue(t, c, "refuse-plain", 0, false)
	fifo := createQueue(t, c, "refuse-fifo", 0, true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, rc := range []struct {
		from, to string
		rate     int
		want     string
	}{
		{plain, q, 10, "is " + queueName(plain) + " named by a queue's RedrivePolicy?"},
		{plain, fifo, 10, "not both FIFO or both standard"},
		{plain, plain, 10, "the same queue"},
		{plain, q, MaxMoveRate + 1, "MaxPerSecond = 501"},
		{plain, q, -1, "MaxPerSecond = -1"},
	} {
		if _, err := MoveTask(ctx, conn, rc.from, rc.to, MoveOptions{MaxPerSecond: rc.rate}); err == nil || !strings.Contains(err.Error(), rc.want) {
			t.Errorf("MoveTask %s → %s at %d: %v, want an error saying %q", queueName(rc.from), queueName(rc.to), rc.rate, err, rc.want)
		}
	}

	// A run whose ctx ends cancels its task: what moved stays moved, the
	// rest stays in the dead-letter queue.
	dq := createQueue(t, c, "refuse-dlq", 0, false)
	setRedrivePolicy(t, c, q, dq, 5)
	sink, err := NewSink(ctx, SinkConfig{QueueURL: dq, Connection: conn})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := sink.Publish(ctx, &ackwise.Message{ID: fmt.Sprint("c", i), Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	short, stop := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer stop()
	res, err := MoveTask(short, conn, dq, q, MoveOptions{MaxPerSecond: 1, Poll: 100 * time.Millisecond})
	if !errors.Is(err, context.DeadlineExceeded) || res.Status != MoveCancelling || res.Moved >= 20 {
		t.Fatalf("MoveTask with a short ctx = %+v, %v; want it cancelled, fewer than 20 moved", res, err)
	}
	left, err := (&Source{client: c, queueURL: dq, name: queueName(dq)}).Backlog(ctx)
	if err != nil || int64(left) != 20-res.Moved {
		t.Errorf("the dead-letter queue holds %d (%v) after %d moved, want %d", left, err, res.Moved, 20-res.Moved)
	}
}
