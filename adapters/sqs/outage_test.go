package sqs

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/sqs/sqstest"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// TestOutageLosesNothing: SQS becomes unreachable for 30 s mid-run (a TCP
// proxy between the client and the emulator resets every connection, open
// or new). The handler forwards each message to another queue through the
// same endpoint, so its work fails too while SQS is away: the breaker
// opens instead of spending attempts, nothing good is dead-lettered, and
// once SQS is back consumption resumes, the messages sent during the
// outage included, and every message reaches the other queue.
func TestOutageLosesNothing(t *testing.T) {
	t.Parallel()
	const before, during = 200, 50
	const outage = 30 * time.Second
	raw := testClient(t)
	// A lease longer than the outage: the messages the breaker holds are
	// still this consumer's when SQS is back (their extensions fail
	// meanwhile), and run as soon as a probe succeeds. The messages whose
	// Nack failed in the outage come back when it ends.
	q := createQueue(t, raw, "outage", 40*time.Second, false)
	dq := createQueue(t, raw, "outage-dlq", 0, false)
	fwd := createQueue(t, raw, "outage-fwd", 0, false)
	proxy, err := sqstest.NewProxy(needSQS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	direct, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: testConn(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	via := Connection{Endpoint: proxy.Endpoint()}
	out, err := NewSink(ctx, SinkConfig{QueueURL: fwd, Connection: via})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	run := randSuffix()
	send := func(from, n int) {
		t.Helper()
		ms := make([]*ackwise.Message, n)
		for i := range ms {
			id := fmt.Sprintf("%s-%d", run, from+i)
			ms[i] = &ackwise.Message{ID: id, Key: id, Payload: []byte(id)}
		}
		if err := direct.Publish(ctx, ms...); err != nil {
			t.Fatal(err)
		}
	}
	send(0, before)

	src, err := NewSource(ctx, Config{QueueURL: q, DeadLetterQueueURL: dq, Connection: via, WaitTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var mu sync.Mutex
	forwarded := map[string]bool{}
	cutAt, allDone := make(chan struct{}), make(chan struct{})
	h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
		if err := out.Publish(ctx, &ackwise.Message{ID: m.ID, Key: m.Key, Payload: m.Payload}); err != nil {
			return err // transient: the dependency is down
		}
		mu.Lock()
		defer mu.Unlock()
		if forwarded[m.ID] {
			return nil // again: an ack lost in the outage
		}
		forwarded[m.ID] = true
		switch len(forwarded) {
		case before / 4:
			close(cutAt)
		case before + during:
			close(allDone)
		}
		return nil
	})
	cons, err := consumer.New(fixedSource{src, newCountFix()}, h, consumer.Config{
		Concurrency: 4,
		MaxInFlight: 40,
		Retry:       retry.Policy{MaxAttempts: 4, InitialInterval: time.Second},
		Breaker:     &consumer.Breaker{Threshold: 5, ProbeInterval: time.Second, MaxProbeInterval: 2 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer startConsumer(ctx, t, cons)()

	select {
	case <-cutAt:
	case <-ctx.Done():
		t.Fatalf("the first %d messages were not handled: %+v", before/4, cons.Stats())
	}
	proxy.Cut()
	t.Logf("cut after %d forwarded: %+v", before/4, cons.Stats())
	send(before, during) // straight to the emulator: the queue fills meanwhile
	select {
	case <-time.After(outage): // the outage itself, not a wait for a signal
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	atCut := cons.Stats()
	proxy.Restore()
	restored := time.Now()
	t.Logf("restored, %d connections reset while cut: %+v", proxy.Refused(), atCut)
	if proxy.Refused() == 0 {
		t.Error("no connection came while cut: the outage was not seen")
	}
	if atCut.BreakerTrips == 0 {
		t.Errorf("the breaker never opened during the outage: %+v", atCut)
	}
	select {
	case <-allDone:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of %d forwarded after the outage: %+v", len(forwarded), before+during, cons.Stats())
	}
	t.Logf("all forwarded %v after the restore", time.Since(restored).Round(time.Millisecond))
	stats := cons.Stats()
	if stats.DeadLettered != 0 {
		t.Errorf("%d dead-lettered: %+v", stats.DeadLettered, stats)
	}
	if dl := drain(ctx, t, raw, dq); len(dl) > 0 {
		t.Errorf("%d in the dead-letter queue, first %s", len(dl), dl[0].ID)
	}
	got := map[string]bool{}
	for _, m := range drain(ctx, t, raw, fwd) {
		got[m.ID] = true
	}
	if len(got) != before+during {
		t.Errorf("%d distinct messages forwarded, want %d", len(got), before+during)
	}
	t.Logf("after: %+v", stats)
}
