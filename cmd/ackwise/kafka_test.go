package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/kafka"
	"github.com/ackwise/ackwise/dlq"
)

// kafkaIdle is the CLI's -idle against kfake: the first receive of a run
// includes joining the consumer group.
const kafkaIdle = "3s"

// TestKafkaRoundTrip dead-letters records through the Kafka adapter's own
// DeadLetter on a kfake broker, then inspects, dry-runs and redrives them
// with the CLI and reads the result back with a plain franz-go client.
func TestKafkaRoundTrip(t *testing.T) {
	t.Parallel()
	c, addr := kfakeCluster(t)
	topic := fmt.Sprintf("orders-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	createTopic(t, ctx, c, topic, 1)
	workURL := "kafka://" + addr + "/" + topic
	deadURL := func(group string) string { return "kafka://" + addr + "/" + topic + ".dlq?group=" + group }

	sink, err := adapters.OpenSink(ctx, workURL)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	payload := []byte{0x00, 0xff, 0xc3, 0x28, '\n'}
	for i := range 4 {
		m := &ackwise.Message{ID: fmt.Sprint("e", i), Key: "k", Payload: payload, Headers: ackwise.HeadersOf("x-tenant", "acme")}
		if err := sink.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	src, err := adapters.OpenSource(ctx, workURL+"?group=app")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]*ackwise.Message, 4)
	for got := 0; got < 4; {
		n, err := src.Receive(ctx, buf[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	for i, m := range buf {
		reason := dlq.ReasonPermanent
		if i == 3 {
			reason = dlq.ReasonMaxAttempts
		}
		if err := src.DeadLetter(ctx, m, dlq.New(m, reason, errors.New("bad input"), ackwise.ClassPermanent, time.Now(), "billing", "v1")); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	// Inspecting twice with one group sees the same letters: nothing is
	// committed.
	for range 2 {
		code, out, errOut := ackwiseRun(t, "dlq", "inspect", deadURL("ops-inspect"), "--idle", kafkaIdle)
		got := lines(out)
		if code != exitOK || len(got) != 4 || !strings.HasPrefix(got[0], "e0 reason=permanent class=permanent attempts=1 source="+topic) ||
			!strings.HasPrefix(got[3], "e3 reason=max-attempts") {
			t.Fatalf("inspect: exit %d\nstdout %s\nstderr %s", code, out, errOut)
		}
	}
	code, out, errOut := ackwiseRun(t, "dlq", "redrive", "--yes", deadURL("ops-redrive"), workURL, "--dry-run", "--reason", "permanent", "--idle", kafkaIdle)
	if code != exitOK || !strings.Contains(out, "would move 3 ") || !strings.Contains(out, "skipped 1 ") {
		t.Fatalf("dry run: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = ackwiseRun(t, "dlq", "redrive", "--yes", deadURL("ops-redrive"), workURL, "--reason", "permanent", "--rate", "-1", "--idle", kafkaIdle)
	// The run ends at what the dead-letter queue held as it started
	// (the source's Backlog), not at the idle timeout.
	if code != exitOK || !strings.HasPrefix(out, "moved 3 ") || !strings.Contains(out, "skipped 1 ") || !strings.Contains(out, "stopped: backlog (received the 4 messages") {
		t.Fatalf("redrive: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}

	// The work topic holds the four originals and the three redriven
	// copies, which only lack the envelope.
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for len(recs) < 7 {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("read %s after %d records: %v", topic, len(recs), err)
		}
		recs = append(recs, fs.Records()...)
	}
	for i, r := range recs[4:] {
		h := map[string]string{}
		for _, kv := range r.Headers {
			h[kv.Key] = string(kv.Value)
		}
		if h[ackwise.HeaderEventID] != fmt.Sprint("e", i) || string(r.Value) != string(payload) || string(r.Key) != "k" || h["x-tenant"] != "acme" {
			t.Fatalf("redriven record %d: key %q value %x headers %v", i, r.Key, r.Value, h)
		}
		for k := range h {
			if strings.HasPrefix(k, dlq.HeaderPrefix) {
				t.Fatalf("redriven record %d kept %s", i, k)
			}
		}
	}

	// The skipped record is still there for the next run of the group.
	code, out, errOut = ackwiseRun(t, "dlq", "inspect", deadURL("ops-redrive"), "--idle", kafkaIdle)
	if code != exitOK || len(lines(out)) != 1 || !strings.HasPrefix(out, "e3 reason=max-attempts") {
		t.Fatalf("inspect after redrive: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
}

// kfakeCluster starts a kfake broker, closed when t ends, and returns it
// with its address for a kafka:// URL.
func kfakeCluster(t *testing.T) (*kfake.Cluster, string) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, strings.Join(c.ListenAddrs(), ",")
}

// createTopic creates topic on c with the given partitions.
func createTopic(t *testing.T, ctx context.Context, c *kfake.Cluster, topic string, partitions int32) {
	t.Helper()
	if err := kafka.CreateTopics(ctx, kafka.SourceConfig{ClientConfig: kafka.ClientConfig{Brokers: c.ListenAddrs()}, Topic: topic}, partitions, 1); err != nil {
		t.Fatal(err)
	}
}

// TestKafkaStatsBrokerOldestAge checks that stats on a Kafka dead-letter
// topic prints the oldest age the broker tells (kafka.Source.Oldest, the
// oldest record the group has not read, by its envelope's last failure)
// rather than the sample's, in text and JSON, and "none" when the topic is
// empty.
func TestKafkaStatsBrokerOldestAge(t *testing.T) {
	t.Parallel()
	c, addr := kfakeCluster(t)
	topic := fmt.Sprintf("orders-%d.dlq", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	createTopic(t, ctx, c, topic, 2)
	deadURL := "kafka://" + addr + "/" + topic + "?group=ops"

	code, out, errOut := ackwiseRun(t, "dlq", "stats", deadURL, "--idle", kafkaIdle)
	if code != exitOK || !strings.Contains(out, "depth: 0 ") || !strings.Contains(out, "oldest age: none (the broker's: no dead letter left to read)\n") {
		t.Fatalf("stats of an empty topic: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}

	// Partition 1 holds the oldest, failed at t0; partition 0 one failed
	// later but written first. The records' own timestamps are now.
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i, p := range []int32{0, 1, 1} {
		at := t0.Add(time.Duration(2-i) * time.Hour) // 12:00, 11:00, 10:00
		if i == 2 {
			at = t0.Add(3 * time.Hour) // written after the oldest
		}
		m := &ackwise.Message{ID: fmt.Sprint("e", i), Source: "orders", Partition: -1, Offset: -1}
		env := dlq.New(m, dlq.ReasonPermanent, errors.New("bad input"), ackwise.ClassPermanent, at, "billing", "v1")
		rec := &kgo.Record{Partition: p, Value: []byte("x")}
		for _, kv := range env.Apply(ackwise.HeadersOf(ackwise.HeaderEventID, m.ID)) {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: kv.Key, Value: []byte(kv.Value)})
		}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// The oldest unread: partition 0's first (12:00) and partition 1's
	// first (11:00); the 13:00 one behind it is not looked at.
	code, out, errOut = ackwiseRun(t, "dlq", "stats", deadURL, "--idle", kafkaIdle)
	if code != exitOK || !strings.Contains(out, "depth: 3 ") ||
		!strings.Contains(out, "oldest age: ") || !strings.Contains(out, " (the broker's: the oldest dead letter not yet read, written 2026-11-29T11:00:00Z)\n") ||
		strings.Contains(out, "oldest dead letter: written") {
		t.Fatalf("stats: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = ackwiseRun(t, "dlq", "stats", deadURL, "--idle", kafkaIdle, "--json")
	var s statsOut
	if err := json.Unmarshal([]byte(out), &s); err != nil || code != exitOK {
		t.Fatalf("stats --json: exit %d, %v\nstdout %s\nstderr %s", code, err, out, errOut)
	}
	if s.BrokerOldest == nil || !s.BrokerOldest.Equal(t0.Add(time.Hour)) || s.BrokerOldestAgeSeconds == nil ||
		*s.BrokerOldestAgeSeconds < time.Since(t0.Add(time.Hour)).Seconds()-60 {
		t.Fatalf("stats --json: broker oldest %v, age %v", s.BrokerOldest, s.BrokerOldestAgeSeconds)
	}
}
