package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// deadLetters is how many dead letters the broker stats tests write: more
// than RabbitMQ's default prefetch (128), which bounds what a sample holds.
const deadLetters = 300

// publishDeadLetters publishes n messages carrying an envelope to sinkURL.
func publishDeadLetters(t *testing.T, ctx context.Context, sinkURL, source string, n int) {
	t.Helper()
	sink, err := adapters.OpenSink(ctx, sinkURL)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	msgs := make([]*ackwise.Message, n)
	for i := range msgs {
		env := dlq.Envelope{Reason: dlq.ReasonPermanent, Error: "bad", ErrorClass: "permanent", Source: source, Partition: -1, Offset: -1, Attempts: 1, LastFailure: lastFailure}
		msgs[i] = &ackwise.Message{ID: fmt.Sprint("e", i), Payload: []byte("x"), Headers: env.Apply(nil)}
	}
	if err := sink.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
}

// TestRabbitMQStatsDepth: stats reports the queue's depth from the broker
// (300), not the sample, which RabbitMQ's prefetch cuts at 128 and which
// says so; a queue that does not exist is an error, not an empty DLQ.
func TestRabbitMQStatsDepth(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ; -short runs offline tests only")
	}
	t.Parallel()
	conn, queue := freshRabbitQueue(t, "ackwise-cli-stats-")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch := declareQueues(t, conn, queue+".dlq")
	publishDeadLetters(t, ctx, rabbitURL()+"/"+queue+".dlq", queue, deadLetters)
	deadURL := rabbitURL() + "/" + queue + ".dlq?plain=true"

	code, out, errOut := ackwiseRun(t, "dlq", "stats", deadURL, "--idle", "2s")
	if code != exitOK || !strings.HasPrefix(out, "depth: 300 (the broker's count)\n") ||
		!strings.Contains(out, "sample: 128 messages (dead letters: 128, without envelope: 0); cut short: 128 of 300,") ||
		!strings.Contains(out, "event IDs: 128 distinct (copies: 0;") {
		t.Fatalf("stats: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	// Nothing was consumed: every message is back in the queue once the
	// broker has handled the releases (requeues), which it does after the
	// command returned.
	deadline := time.Now().Add(10 * time.Second)
	for {
		q, err := ch.QueueDeclarePassive(queue+".dlq", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages == deadLetters {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead-letter queue holds %d ready messages, want %d", q.Messages, deadLetters)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A larger prefetch lets the sample take every message.
	code, out, errOut = ackwiseRun(t, "dlq", "stats", deadURL+"&prefetch=1000", "-n", "300", "--idle", "20s", "--json")
	if code != exitOK || !strings.Contains(out, `"depth":300,"messages":300,"sample_cut_short":false,`) {
		t.Fatalf("stats -json, prefetch 1000: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}

	code, out, errOut = ackwiseRun(t, "dlq", "stats", rabbitURL()+"/"+queue+".missing?plain=true", "--idle", "500ms")
	if code != exitFailed || out != "" || !strings.Contains(errOut, "not exist") {
		t.Fatalf("stats of a missing queue: exit %d, want %d\nstdout %s\nstderr %s", code, exitFailed, out, errOut)
	}
}

// TestKafkaStatsDepth: stats reports the topic's depth from the broker
// (end offsets less the group's commits: 300) and samples all of it; a topic
// that does not exist is an error, not an empty DLQ.
func TestKafkaStatsDepth(t *testing.T) {
	t.Parallel()
	c, addr := kfakeCluster(t)
	topic := fmt.Sprintf("orders-%d.dlq", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	createTopic(t, ctx, c, topic, 3)
	publishDeadLetters(t, ctx, "kafka://"+addr+"/"+topic, "orders", deadLetters)

	// -n 300: the sample ends as it has them all; the idle timeout covers
	// the group's join, slow on a busy machine.
	code, out, errOut := ackwiseRun(t, "dlq", "stats", "kafka://"+addr+"/"+topic+"?group=ops", "-n", "300", "--idle", "20s")
	if code != exitOK || !strings.HasPrefix(out, "depth: 300 (the broker's count)\n") ||
		!strings.Contains(out, "sample: 300 messages (dead letters: 300, without envelope: 0)\n") ||
		!strings.Contains(out, "event IDs: 300 distinct (copies: 0;") {
		t.Fatalf("stats: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}

	code, out, errOut = ackwiseRun(t, "dlq", "stats", "kafka://"+addr+"/no-such-topic?group=ops", "--idle", kafkaIdle)
	if code != exitFailed || out != "" || !strings.Contains(errOut, "not exist") {
		t.Fatalf("stats of a missing topic: exit %d, want %d\nstdout %s\nstderr %s", code, exitFailed, out, errOut)
	}
}
