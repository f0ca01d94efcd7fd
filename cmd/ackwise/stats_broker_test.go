package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

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
	// lag reads the depth without consuming: nothing held, nothing moved.
	code, out, errOut = ackwiseRun(t, "lag", deadURL, "--window", "200ms")
	if code != exitOK || !strings.Contains(out, "depth: 300 messages (was 300), the broker's count\n") || !strings.Contains(out, "time to drain: never") {
		t.Fatalf("lag: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if code, out, errOut := ackwiseRun(t, "lag", rabbitURL()+"/"+queue+".missing", "--window", "10ms"); code != exitFailed || !strings.Contains(errOut, "does not exist") {
		t.Fatalf("lag of a missing queue: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	waitRabbitReady(t, ch, queue+".dlq", deadLetters)

	declareQueues(t, conn, queue) // the sample's target
	showAndSample(t, deadURL, rabbitURL()+"/"+queue+"?prefetch=64&consumer_timeout=10m", "prefetch, consumer_timeout", "2s")
	waitRabbitReady(t, ch, queue, 10)
	waitRabbitReady(t, ch, queue+".dlq", deadLetters-10)
	code, out, errOut = ackwiseRun(t, "dlq", "stats", deadURL, "--idle", "500ms", "-n", "1")
	if code != exitOK || !strings.HasPrefix(out, "depth: 290 (the broker's count)\n") {
		t.Fatalf("stats after the sample: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
}

// showAndSample checks, on a dead-letter destination holding the
// deadLetters of publishDeadLetters, that show prints one by event ID and
// that a sampled redrive of 10 at a capped rate moves 10 to target (a
// consumer's source URL, whose source parameters dropped are named),
// printing progress lines on stderr as it goes.
func showAndSample(t *testing.T, deadURL, target, dropped, idle string) {
	t.Helper()
	code, out, errOut := ackwiseRun(t, "dlq", "show", deadURL, "e5", "-n", "100", "--idle", idle)
	if code != exitOK || !strings.HasPrefix(out, "event ID:      e5\n") || !strings.Contains(out, "  reason:") ||
		!strings.Contains(out, "headers:\n") || !strings.Contains(out, "payload:       1 bytes (--payload prints it)\n") {
		t.Fatalf("show e5: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	// 10 at 20/s take at least 450ms: progress lines 100ms apart.
	code, out, errOut = ackwiseRun(t, "dlq", "redrive", "--yes", deadURL, target, "--sample", "10", "--rate", "20", "--progress-every", "100ms", "--idle", idle)
	if code != exitOK || !strings.HasPrefix(out, "moved 10 ") || !strings.Contains(out, "stopped: sample (10 moved") {
		t.Fatalf("redrive --sample 10: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if !strings.Contains(errOut, "dropped its source parameters "+dropped+"\n") || strings.Count(errOut, "progress: moved ") < 2 {
		t.Fatalf("redrive --sample 10: stderr lacks the note on %s or progress lines:\n%s", dropped, errOut)
	}
}

// waitRabbitReady waits until queue holds n ready messages: released
// deliveries are requeued by the broker after the command returned.
func waitRabbitReady(t *testing.T, ch *amqp.Channel, queue string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d ready messages, want %d", queue, q.Messages, n)
		}
		time.Sleep(10 * time.Millisecond)
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
	if code, out, errOut := ackwiseRun(t, "lag", "kafka://"+addr+"/no-such-topic?group=ops", "--window", "10ms"); code != exitFailed || !strings.Contains(errOut, "not exist") {
		t.Fatalf("lag of a missing topic: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}

	work := topic + ".work"
	createTopic(t, ctx, c, work, 1)
	showAndSample(t, "kafka://"+addr+"/"+topic+"?group=ops", "kafka://"+addr+"/"+work+"?group=app&commit_interval=1s", "group, commit_interval", "20s")
	// The group committed the 10 it moved as the redrive closed its source.
	code, out, errOut = ackwiseRun(t, "lag", "kafka://"+addr+"/"+topic+"?group=ops", "--window", "200ms", "--json")
	var r lagReport
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != exitOK || !r.Log || r.Backlog != deadLetters-10 || r.DrainSeconds != nil ||
		*r.IngressRate != 0 || *r.ConsumeRate != 0 || len(r.Partitions) != 3 {
		t.Fatalf("lag: exit %d, %v\nstdout %s\nstderr %s", code, err, out, errOut)
	}
	code, out, errOut = ackwiseRun(t, "dlq", "stats", "kafka://"+addr+"/"+topic+"?group=ops", "-n", "1", "--idle", "20s")
	if code != exitOK || !strings.HasPrefix(out, "depth: 290 (the broker's count)\n") {
		t.Fatalf("stats after the sample: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
}
