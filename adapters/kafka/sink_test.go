package kafka

import (
	"context"
	"crypto/rand"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

func TestSinkKeysHeadersAndEventID(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 4)
	sink := openSink(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var msgs []*ackwise.Message
	for i := 0; i < 40; i++ {
		msgs = append(msgs, &ackwise.Message{ID: "ev-" + strconv.Itoa(i), Key: "k" + strconv.Itoa(i%5), Payload: []byte{byte(i), 0xff}, Headers: ackwise.HeadersOf("h", "v")})
	}
	msgs = append(msgs, &ackwise.Message{Payload: []byte("no key, no id")})
	if err := sink.Publish(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	recs := readAll(ctx, t, brokers, cfg.Topic)
	if len(recs) != len(msgs) {
		t.Fatalf("%d records, want %d", len(recs), len(msgs))
	}
	part := map[string]int32{}
	for _, r := range recs {
		m := recordMessage(r)
		if m.Key == "" {
			if r.Key != nil || m.ID != "" {
				t.Errorf("keyless message got key %q id %q", r.Key, m.ID)
			}
			continue
		}
		if p, ok := part[m.Key]; ok && p != r.Partition {
			t.Errorf("key %s in partitions %d and %d", m.Key, p, r.Partition)
		}
		part[m.Key] = r.Partition
		if m.Headers.Get("h") != "v" || m.ID == "" {
			t.Errorf("record %s/%d@%d headers %v", r.Topic, r.Partition, r.Offset, m.Headers)
		}
	}
	// Produce settings: acks=all and idempotence, checked on the client.
	opts := sink.Client().OptValues(kgo.RequiredAcks)
	if len(opts) != 1 || opts[0].(kgo.Acks) != kgo.AllISRAcks() {
		t.Errorf("RequiredAcks %v, want all", opts)
	}
	if v := sink.Client().OptValue(kgo.DisableIdempotentWrite); v != false {
		t.Errorf("idempotent writes disabled: %v", v)
	}
}

func TestSinkReturnsProduceErrors(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t) // no topic auto-creation
	sink := openSink(t, SourceConfig{ClientConfig: ClientConfig{Brokers: brokers, Options: []kgo.Opt{kgo.UnknownTopicRetries(1)}}, Topic: "missing-" + uniq("x")})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := sink.Publish(ctx, &ackwise.Message{ID: "a", Payload: []byte("x")})
	if err == nil {
		t.Fatal("publish to a missing topic succeeded")
	}
	if err := sink.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := sink.Publish(ctx, &ackwise.Message{Payload: []byte("x")}); !errors.Is(err, adapters.ErrClosed) {
		t.Fatalf("publish after close: %v, want ErrClosed", err)
	}
}

func TestOpenByURL(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	base := "kafka://" + brokers[0] + "/" + cfg.Topic
	sink, err := adapters.OpenSink(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if err := sink.Publish(ctx, &ackwise.Message{ID: "u1", Key: "k", Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	src, err := adapters.OpenSource(ctx, base+"?group="+cfg.Group+"&tiers=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if !src.Capabilities().Delay {
		t.Error("tiers from the URL not applied")
	}
	m := receiveN(t, src, 1)[0]
	if m.ID != "u1" {
		t.Fatalf("got %+v", m)
	}
	if _, err := adapters.OpenSource(ctx, "kafka://u:hunter2@"+brokers[0]+"/"+cfg.Topic+"?group=g&sasl=nope"); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("bad sasl: %v", err)
	}
	if _, err := adapters.OpenSource(ctx, base); err == nil {
		t.Fatal("source without group opened")
	}
}

// TestSinkReportsRecordTooLarge: the broker refuses a record over the
// topic's max.message.bytes (MESSAGE_TOO_LARGE); Publish lists that record
// alone, with a permanent error, and the others of the call are confirmed
// and stored. The refused record is on a partition of its own: Kafka
// refuses a partition's batch as a whole, so a small record batched with it
// would fail with it.
func TestSinkReportsRecordTooLarge(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 2)
	sink := openSink(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const limit = 1024
	// Set after NewSink read the topic's limit: the broker refuses.
	setMaxMessageBytes(ctx, t, brokers, cfg.Topic, limit)
	small, big := keysOnTwoPartitions(t, cfg.Topic)
	msgs := []*ackwise.Message{
		{ID: "ok-0", Key: small, Payload: []byte("a")},
		{ID: "big", Key: big, Payload: incompressible(4 * limit)},
		{ID: "ok-2", Key: small, Payload: []byte("b")},
	}
	err := sink.Publish(ctx, msgs...)
	pe, ok := errors.AsType[*adapters.PublishError](err)
	if !ok || len(pe.Failed) != 1 || pe.Failed[0].Index != 1 {
		t.Fatalf("Publish = %v, want an adapters.PublishError listing msgs[1] alone", err)
	}
	if f := pe.Failed[0].Err; !errors.Is(f, kerr.MessageTooLarge) || ackwise.ClassOf(f) != ackwise.ClassPermanent {
		t.Fatalf("msgs[1]: %v (class %v), want a permanent MESSAGE_TOO_LARGE", f, ackwise.ClassOf(f))
	}
	if ackwise.ClassOf(err) != ackwise.ClassPermanent {
		t.Errorf("Publish error class %v, want permanent (the class of its part)", ackwise.ClassOf(err))
	}
	var got []string
	for _, r := range readAll(ctx, t, brokers, cfg.Topic) {
		got = append(got, recordMessage(r).ID)
	}
	if g := strings.Join(got, ","); g != "ok-0,ok-2" {
		t.Fatalf("stored %s, want ok-0,ok-2", g)
	}
}

// TestSinkBatchesUnderTopicLimit: records that each fit under the topic's
// max.message.bytes are confirmed, however many are published at once. The
// sink batches under the limit it read at NewSink; before, franz-go batched
// up to 1MB a partition, the broker refused the batch (MESSAGE_TOO_LARGE)
// and every record of it was reported refused for good (ackwise.Permanent),
// though each fits. A record over the limit fails alone.
func TestSinkBatchesUnderTopicLimit(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const limit = 2048
	setMaxMessageBytes(ctx, t, brokers, cfg.Topic, limit)
	sink := openSink(t, cfg)
	var msgs []*ackwise.Message
	for i := range 40 {
		msgs = append(msgs, &ackwise.Message{ID: "m" + strconv.Itoa(i), Key: "k", Payload: incompressible(limit / 10)})
	}
	msgs[20].Payload = incompressible(limit + 1)
	err := sink.Publish(ctx, msgs...)
	pe, ok := errors.AsType[*adapters.PublishError](err)
	if !ok || len(pe.Failed) != 1 || pe.Failed[0].Index != 20 {
		t.Fatalf("Publish = %v, want an adapters.PublishError listing msgs[20] alone", err)
	}
	if f := pe.Failed[0].Err; !errors.Is(f, kerr.MessageTooLarge) || ackwise.ClassOf(f) != ackwise.ClassPermanent {
		t.Fatalf("msgs[20]: %v (class %v), want a permanent MESSAGE_TOO_LARGE", f, ackwise.ClassOf(f))
	}
	if n := len(readAll(ctx, t, brokers, cfg.Topic)); n != len(msgs)-1 {
		t.Fatalf("%d records stored, want %d", n, len(msgs)-1)
	}
}

// setMaxMessageBytes sets topic's max.message.bytes.
func setMaxMessageBytes(ctx context.Context, t testing.TB, brokers []string, topic string, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	set := []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: kadm.StringPtr(strconv.Itoa(n))}}
	resp, err := kadm.NewClient(cl).AlterTopicConfigs(ctx, set, topic)
	if err == nil {
		err = resp[0].Err
	}
	if err != nil {
		t.Fatalf("set max.message.bytes of %s: %v", topic, err)
	}
}

// keysOnTwoPartitions returns two keys the sink puts on different
// partitions of a two-partition topic.
func keysOnTwoPartitions(t *testing.T, topic string) (a, b string) {
	t.Helper()
	p := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	part := func(k string) int { return p.Partition(&kgo.Record{Key: []byte(k)}, 2) }
	a = "k0"
	for i := 1; i < 100; i++ {
		if b = "k" + strconv.Itoa(i); part(b) != part(a) {
			return a, b
		}
	}
	t.Fatal("no two keys on different partitions")
	return
}

// incompressible returns n random bytes: the producer compresses batches,
// and n zeros would fit in a few.
func incompressible(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}
