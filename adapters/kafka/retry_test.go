package kafka

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

func TestRetryTopicChain(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	const short, long = 300 * time.Millisecond, 600 * time.Millisecond
	cfg := testConfig(t, brokers, 1, long, short) // unsorted on purpose
	sink := openSink(t, cfg)
	in := publishN(t, sink, 1, func(int) string { return "order-1" })[0]
	src := openSource(t, cfg)
	if caps := src.Capabilities(); !caps.Delay || !caps.Log || len(caps.DelayTiers) != 2 || caps.DelayTiers[0] != short {
		t.Fatalf("capabilities %+v", caps)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m := receiveN(t, src, 1)[0]
	nacked := time.Now()
	if err := src.Nack(ctx, m, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// The move was confirmed: the source record is committed past.
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 0, 1)
	shortTopic := cfg.Topic + ".retry.300ms"
	moved := readAll(ctx, t, brokers, shortTopic)
	if len(moved) != 1 {
		t.Fatalf("%d records on %s, want 1", len(moved), shortTopic)
	}
	h := recordMessage(moved[0]).Headers
	want := map[string]string{
		ackwise.HeaderAttempt: "2", HeaderOriginalTopic: cfg.Topic, HeaderOriginalPartition: "0", HeaderOriginalOffset: "0",
		ackwise.HeaderEventID: in.ID, "x-seq": "0",
	}
	for k, v := range want {
		if h[k] != v {
			t.Errorf("retry record header %s = %q, want %q", k, h[k], v)
		}
	}
	if due, _ := strconv.ParseInt(h[HeaderRetryDue], 10, 64); time.UnixMilli(due).Before(nacked.Add(short - 10*time.Millisecond)) {
		t.Errorf("due %s, want about %v after the nack", h[HeaderRetryDue], short)
	}
	if string(moved[0].Key) != "order-1" || string(moved[0].Value) != "0" {
		t.Errorf("retry record key %q value %q", moved[0].Key, moved[0].Value)
	}

	// A record published after the nack is not held back by the retry.
	next := publishN(t, sink, 1, func(int) string { return "order-2" })[0]
	got := receiveN(t, src, 1)[0]
	if got.ID != next.ID {
		t.Fatalf("received %s first, want %s (the retry is not due)", got.ID, next.ID)
	}
	if err := src.Ack(ctx, got); err != nil {
		t.Fatal(err)
	}
	// While its head waits, the retry partition is paused, not polled in a
	// sleep. kgo offers no pause event: look until the record is due.
	recv := make(chan *ackwise.Message, 1)
	go func() {
		buf := make([]*ackwise.Message, 1)
		for {
			if n, err := src.Receive(ctx, buf); n == 1 || err != nil {
				recv <- buf[0] // nil on error
				return
			}
		}
	}()
	sawPaused := false
	for !sawPaused && time.Since(nacked) < short-50*time.Millisecond {
		sawPaused = len(src.Client().PauseFetchPartitions(nil)[shortTopic]) == 1
		time.Sleep(2 * time.Millisecond)
	}
	if !sawPaused {
		t.Error("retry partition never paused while its head waited")
	}
	again := <-recv
	if again == nil {
		t.Fatal("receive of the retry failed")
	}
	if waited := time.Since(nacked); waited < short-10*time.Millisecond {
		t.Fatalf("retry delivered after %v, before its tier %v", waited, short)
	}
	if again.ID != in.ID || again.Attempt != 2 || again.Source != cfg.Topic || again.Offset != 0 || again.Partition != 0 ||
		!strings.HasPrefix(again.BrokerID, shortTopic+"/0@") || again.FirstFailure.IsZero() || string(again.Payload) != "0" {
		t.Fatalf("retried message %+v", again)
	}
	if _, ok := again.Headers[HeaderRetryDue]; ok {
		t.Error("internal retry header leaked into Message.Headers")
	}
	if paused := src.Client().PauseFetchPartitions(nil); len(paused) != 0 {
		t.Errorf("partitions still paused after the retry was delivered: %v", paused)
	}
	// Longer than every tier: the longest tier.
	if err := src.Nack(ctx, again, time.Hour); err != nil {
		t.Fatal(err)
	}
	third := receiveN(t, src, 1)[0]
	if third.Attempt != 3 || !strings.HasPrefix(third.BrokerID, cfg.Topic+".retry.600ms/") || third.Offset != 0 || !third.FirstFailure.Equal(again.FirstFailure) {
		t.Fatalf("second hop %+v", third)
	}
	env := dlq.New(third, dlq.ReasonMaxAttempts, context.DeadlineExceeded, ackwise.ClassTransient, time.Now(), "billing", "v1")
	if err := src.DeadLetter(ctx, third, env); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, brokers, cfg.Group, cfg.Topic+".retry.600ms", 0, 1)
	dls := readAll(ctx, t, brokers, cfg.Topic+".dlq")
	if len(dls) != 1 {
		t.Fatalf("%d dead letters", len(dls))
	}
	dm := recordMessage(dls[0])
	got2, err := dlq.Decode(dm.Headers)
	if err != nil {
		t.Fatal(err)
	}
	if got2.Source != cfg.Topic || got2.Offset != 0 || got2.Attempts != 3 || got2.Reason != dlq.ReasonMaxAttempts || dm.Headers["x-seq"] != "0" || dm.ID != in.ID || string(dm.Payload) != "0" || dm.Key != "order-1" {
		t.Fatalf("dead letter %+v envelope %+v", dm, got2)
	}
}

func TestNackWithoutTiersRefuses(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
	src := openSource(t, cfg)
	if src.Capabilities().Delay {
		t.Fatal("Delay without tiers")
	}
	m := receiveN(t, src, 1)[0]
	if err := src.Nack(context.Background(), m, time.Second); err == nil {
		t.Fatal("Nack without tiers succeeded")
	}
	if err := src.Ack(context.Background(), m); err != nil {
		t.Fatalf("ack after refused nack: %v", err)
	}
}

// TestDeadLetterReadableByKcat checks with an independent client (kcat, on
// librdkafka) that the dead letter's value and envelope headers are plain
// Kafka.
func TestDeadLetterReadableByKcat(t *testing.T) {
	t.Parallel()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		if testing.Short() {
			t.Skip("kcat not installed (-short)")
		}
		t.Fatal("kcat not installed: apt-get install -y kcat")
	}
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	publishN(t, openSink(t, cfg), 1, func(int) string { return "acct-7" })
	src := openSource(t, cfg)
	m := receiveN(t, src, 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	env := dlq.New(m, dlq.ReasonPermanent, ackwise.Permanent(context.Canceled), ackwise.ClassPermanent, time.Now(), "billing", "")
	if err := src.DeadLetter(ctx, m, env); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, kcat, "-C", "-b", brokers[0], "-t", cfg.Topic+".dlq", "-o", "beginning", "-e", "-q",
		"-f", "key=%k value=%s headers=%h\n").CombinedOutput()
	if err != nil {
		t.Fatalf("kcat: %v\n%s", err, out)
	}
	line := strings.TrimSpace(string(out))
	for _, want := range []string{"key=acct-7", "value=0", "ackwise-dlq-reason=permanent", "ackwise-dlq-source=" + cfg.Topic, "ackwise-dlq-offset=0", "ackwise-dlq-consumer=billing", "ackwise-event-id=ev-0", "x-seq=0", "ackwise-dlq-message-id=" + cfg.Topic + "/0@0"} {
		if !strings.Contains(line, want) {
			t.Errorf("kcat output lacks %q:\n%s", want, line)
		}
	}
}
