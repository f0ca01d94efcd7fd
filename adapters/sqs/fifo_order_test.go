package sqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// TestFIFOGroupOrderEightWorkers: a FIFO queue holds 20 groups of 30
// messages each, interleaved, and a consumer with 8 workers (default retry
// mode; one poller, see emulatorFIFOPollers) handles them while one
// message in seven fails once, transiently. Every group is handled in send
// order: a message never runs before the one sent before it in its group
// succeeded, so a failed message waiting for its retry holds back its
// group (the default retry mode on an ordered source waits in place, in
// flight: the engine's lane holds the messages of the group already
// received, and AWS hands out no later one while it is in flight). Nothing
// is lost, nothing runs again after it succeeded, and nothing is
// dead-lettered.
//
// (With consumer.RetryBroker the failed message goes back to SQS with its
// delay, and the messages of its group received in the same batch run
// ahead of it: that mode gives up the key's order, as the consumer
// documents; docs/sqs.md says so for FIFO queues.)
func TestFIFOGroupOrderEightWorkers(t *testing.T) {
	t.Parallel()
	testFIFOGroupOrder(t, consumer.RetryAuto)
}

func testFIFOGroupOrder(t *testing.T, mode consumer.RetryMode) {
	const groups, perGroup = 20, 30
	c := testClient(t)
	conn := testConn(t)
	q := createQueue(t, c, "fifo-order", 30*time.Second, true)
	dq := createQueue(t, c, "fifo-order-dlq", 0, true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sink, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: conn})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	run := randSuffix()
	var msgs []*ackwise.Message
	for seq := range perGroup {
		for g := range groups {
			msgs = append(msgs, &ackwise.Message{
				ID:      fmt.Sprintf("%s-g%d-%d", run, g, seq),
				Key:     "g" + strconv.Itoa(g),
				Payload: []byte(strconv.Itoa(seq)),
			})
		}
	}
	if err := sink.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(ctx, Config{QueueURL: q, DeadLetterQueueURL: dq, Connection: conn, WaitTime: time.Second, Pollers: emulatorFIFOPollers})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()

	var mu sync.Mutex
	next := map[string]int{} // by group: the seq to run next
	var bad []string
	failures := 0
	done := make(chan struct{})
	finished := 0
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		seq, err := strconv.Atoi(string(m.Payload))
		if err != nil {
			return ackwise.Permanent(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if want := next[m.Key]; seq != want {
			bad = append(bad, fmt.Sprintf("group %s: message %d ran (attempt %d) while %d was next", m.Key, seq, m.Attempt, want))
		}
		if seq%7 == 3 && m.Attempt == 1 {
			failures++
			return errors.New("downstream busy")
		}
		next[m.Key] = seq + 1
		if seq == perGroup-1 {
			if finished++; finished == groups {
				close(done)
			}
		}
		return nil
	})
	cons, err := consumer.New(fixedSource{src, newCountFix()}, h, consumer.Config{
		Concurrency: 8,
		RetryMode:   mode,
		Retry:       retry.Policy{MaxAttempts: 4, InitialInterval: time.Second, Multiplier: 1, Jitter: retry.NoJitter},
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := startConsumer(ctx, t, cons)
	defer stop()
	select {
	case <-done:
	case <-ctx.Done():
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Errorf("%d out of order, first ones:\n%s", len(bad), strings.Join(bad[:min(len(bad), 10)], "\n"))
	}
	for g := range groups {
		if k := "g" + strconv.Itoa(g); next[k] != perGroup {
			t.Errorf("group %s: %d of %d handled: %+v", k, next[k], perGroup, cons.Stats())
		}
	}
	if want := groups * ((perGroup + 3) / 7); failures != want {
		t.Errorf("%d transient failures, want %d (each message 7k+3 failing once)", failures, want)
	}
	if dl := drain(ctx, t, c, dq); len(dl) > 0 {
		t.Errorf("%d dead-lettered, first %s", len(dl), dl[0].ID)
	}
	if left := drain(ctx, t, c, q); len(left) > 0 {
		t.Errorf("%d left in the queue, first %s", len(left), left[0].ID)
	}
}
