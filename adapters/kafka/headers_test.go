package kafka

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// TestRepeatedHeaderKeysKept: Kafka headers are an ordered list in which a
// key may repeat. The message keeps all of them in order (Get returns the
// last), and the dead letter carries all of them.
func TestRepeatedHeaderKeysKept(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	sent := []kgo.RecordHeader{
		{Key: ackwise.HeaderEventID, Value: []byte("ev-1")},
		{Key: "x-hop", Value: []byte("a")},
		{Key: "x-empty", Value: nil},
		{Key: "x-hop", Value: []byte("b")},
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: cfg.Topic, Key: []byte("k"), Value: []byte("v"), Headers: sent}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	src := openSource(t, cfg)
	m := receiveN(t, src, 1)[0]
	want := ackwise.Headers{{Key: ackwise.HeaderEventID, Value: "ev-1"}, {Key: "x-hop", Value: "a"}, {Key: "x-empty", Value: ""}, {Key: "x-hop", Value: "b"}}
	if !reflect.DeepEqual(m.Headers, want) {
		t.Fatalf("headers %v, want %v", m.Headers, want)
	}
	if m.Headers.Get("x-hop") != "b" || m.ID != "ev-1" || m.Key != "k" {
		t.Fatalf("Get(x-hop) = %q, ID %q, Key %q", m.Headers.Get("x-hop"), m.ID, m.Key)
	}
	env := dlq.New(m, dlq.ReasonPermanent, ackwise.Permanent(context.Canceled), ackwise.ClassPermanent, time.Now(), "billing", "")
	if err := src.DeadLetter(ctx, m, env); err != nil {
		t.Fatal(err)
	}
	dead := readAll(ctx, t, brokers, cfg.Topic+".dlq")
	if len(dead) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dead))
	}
	var hops []string
	for _, h := range dead[0].Headers {
		if h.Key == "x-hop" {
			hops = append(hops, string(h.Value))
		}
	}
	if !reflect.DeepEqual(hops, []string{"a", "b"}) {
		t.Fatalf("dead letter x-hop headers %q, want [a b] in order", hops)
	}
}

// TestRecycle: a recycled message's memory serves a later delivery, a second
// Recycle and a Recycle of a foreign message are ignored, and a recycled
// message can no longer be settled.
func TestRecycle(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	publishN(t, openSink(t, cfg), 3, func(int) string { return "k" })
	src := openSource(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	buf := make([]*ackwise.Message, 1)
	if _, err := src.Receive(ctx, buf); err != nil {
		t.Fatal(err)
	}
	first := buf[0]
	if err := src.Ack(ctx, first); err != nil {
		t.Fatal(err)
	}
	src.Recycle(first)
	if src.Valid(first) {
		t.Fatal("a recycled message is still valid")
	}
	if err := src.Release(ctx, first); err == nil {
		t.Fatal("Release of a recycled message succeeded")
	}
	if err := src.DeadLetter(ctx, first, dlq.New(first, dlq.ReasonPermanent, errors.New("bad"), ackwise.ClassPermanent, time.Now(), "t", "v1")); err == nil {
		t.Fatal("DeadLetter of a recycled message succeeded (a copy would reach the dead-letter topic)")
	}
	if err := src.Ack(ctx, first); err == nil {
		t.Fatal("Ack of a recycled message succeeded")
	}
	src.Recycle(first)                           // ignored: already recycled
	src.Recycle(&ackwise.Message{ID: "foreign"}) // ignored: not ours
	src.Recycle(nil)                             // ignored

	got := receiveN(t, src, 2)
	for i, m := range got {
		if want := "ev-" + string(rune('1'+i)); m.ID != want || m.Offset != int64(i+1) {
			t.Fatalf("message %d: ID %q offset %d, want %q at %d", i, m.ID, m.Offset, want, i+1)
		}
		if err := src.Ack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 0, 3)
}
