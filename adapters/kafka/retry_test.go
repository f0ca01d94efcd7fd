package kafka

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

func TestRetryTopicChain(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	// short leaves time to see the pause even when the machine is loaded
	// (the whole suite under -race on two cores): the steps between the
	// nack and the look took over 250 ms there, and a machine with load 30
	// is several times slower again.
	const short, long = 3 * time.Second, 4 * time.Second
	cfg := testConfig(t, brokers, 1, long, short) // unsorted on purpose
	sink := openSink(t, cfg)
	in := publishN(t, sink, 1, func(int) string { return "order-1" })[0]
	src := openSource(t, cfg)
	if caps := src.Capabilities(); !caps.Delay || !caps.Log || len(caps.DelayTiers) != 2 || caps.DelayTiers[0] != short {
		t.Fatalf("capabilities %+v", caps)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := receiveN(t, src, 1)[0]
	nacked := time.Now()
	if err := src.Nack(ctx, m, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// The move was confirmed: the source record is committed past.
	waitCommitted(t, brokers, cfg.Group, cfg.Topic, 0, 1)
	shortTopic := cfg.Topic + ".retry.3s"
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
		if h.Get(k) != v {
			t.Errorf("retry record header %s = %q, want %q", k, h.Get(k), v)
		}
	}
	if due, _ := strconv.ParseInt(h.Get(HeaderRetryDue), 10, 64); time.UnixMilli(due).Before(nacked.Add(short - 10*time.Millisecond)) {
		t.Errorf("due %s, want about %v after the nack", h.Get(HeaderRetryDue), short)
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
	if _, ok := again.Headers.Lookup(HeaderRetryDue); ok {
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
	if third.Attempt != 3 || !strings.HasPrefix(third.BrokerID, cfg.Topic+".retry.4s/") || third.Offset != 0 || !third.FirstFailure.Equal(again.FirstFailure) {
		t.Fatalf("second hop %+v", third)
	}
	env := dlq.New(third, dlq.ReasonMaxAttempts, context.DeadlineExceeded, ackwise.ClassTransient, time.Now(), "billing", "v1")
	if err := src.DeadLetter(ctx, third, env); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, brokers, cfg.Group, cfg.Topic+".retry.4s", 0, 1)
	dls := readAll(ctx, t, brokers, cfg.Topic+".dlq")
	if len(dls) != 1 {
		t.Fatalf("%d dead letters", len(dls))
	}
	dm := recordMessage(dls[0])
	got2, err := dlq.Decode(dm.Headers)
	if err != nil {
		t.Fatal(err)
	}
	if got2.Source != cfg.Topic || got2.Offset != 0 || got2.Attempts != 3 || got2.Reason != dlq.ReasonMaxAttempts || dm.Headers.Get("x-seq") != "0" || dm.ID != in.ID || string(dm.Payload) != "0" || dm.Key != "order-1" {
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

// TestRetryDueBoundedByTier: a retry record whose due time lies further
// ahead than its tier (the member that nacked it had a clock running ahead,
// or the header is corrupt) waits at most its tier on this member, instead
// of pausing its retry partition until that far-off time.
func TestRetryDueBoundedByTier(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	const tier = 300 * time.Millisecond
	cfg := testConfig(t, brokers, 1, tier)
	src := openSource(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	retryTopic := DefaultRetryTopic(cfg.Topic, tier)
	rec := &kgo.Record{Topic: retryTopic, Key: []byte("k"), Value: []byte("v"), Headers: []kgo.RecordHeader{
		{Key: ackwise.HeaderEventID, Value: []byte("ev-skew")},
		{Key: ackwise.HeaderAttempt, Value: []byte("2")},
		{Key: HeaderRetryDue, Value: []byte(strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10))},
		{Key: HeaderOriginalTopic, Value: []byte(cfg.Topic)},
		{Key: HeaderOriginalPartition, Value: []byte("0")},
		{Key: HeaderOriginalOffset, Value: []byte("7")},
	}}
	if err := src.Client().ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	buf := make([]*ackwise.Message, 1)
	n, err := src.Receive(rctx, buf)
	if err != nil || n != 1 {
		t.Fatalf("retry record due an hour ahead not delivered within 5s (tier %v): n=%d err=%v", tier, n, err)
	}
	if buf[0].ID != "ev-skew" || buf[0].Offset != 7 || buf[0].Attempt != 2 {
		t.Fatalf("got %+v", buf[0])
	}
	if waited := time.Since(start); waited < tier-50*time.Millisecond {
		t.Fatalf("delivered after %v, before its tier %v", waited, tier)
	}
	if err := src.Ack(ctx, buf[0]); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, brokers, cfg.Group, retryTopic, 0, 1)
}

// TestReassignedRetryPartitionFetches: franz-go keeps a partition paused
// across assignments. A retry partition left paused in the client when it was
// revoked (a pause decided before the revoke and applied after it, which the
// source now rules out by pausing under its lock) must fetch again once it is
// assigned back: the assignment resumes it.
func TestReassignedRetryPartitionFetches(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	const tier = 200 * time.Millisecond
	cfg := testConfig(t, brokers, 1, tier)
	cfg.Options = fastGroup
	retryTopic := DefaultRetryTopic(cfg.Topic, tier)
	publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
	a := openSource(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := a.Ack(ctx, receiveN(t, a, 1)[0]); err != nil { // a owns both partitions
		t.Fatal(err)
	}
	// b takes the retry partition: it subscribes to nothing else.
	assigned := make(chan struct{}, 1)
	b, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(cfg.Group), kgo.ConsumeTopics(retryTopic),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			if len(m[retryTopic]) > 0 {
				select {
				case assigned <- struct{}{}:
				default:
				}
			}
		})}, fastGroup...)...)
	if err != nil {
		t.Fatal(err)
	}
	go func() { // b must poll for its group membership to progress
		for {
			if b.PollFetches(ctx).IsClientClosed() || ctx.Err() != nil {
				return
			}
		}
	}()
	select {
	case <-assigned:
	case <-ctx.Done():
		b.Close()
		t.Fatal("the retry partition never moved to the second member")
	}
	// The leftover pause, then the partition comes back to a.
	a.Client().PauseFetchPartitions(map[string][]int32{retryTopic: {0}})
	b.Close()
	rec := &kgo.Record{Topic: retryTopic, Key: []byte("k"), Value: []byte("v"), Headers: []kgo.RecordHeader{
		{Key: ackwise.HeaderEventID, Value: []byte("ev-back")},
		{Key: ackwise.HeaderAttempt, Value: []byte("2")},
		{Key: HeaderRetryDue, Value: []byte(strconv.FormatInt(time.Now().UnixMilli(), 10))},
		{Key: HeaderOriginalTopic, Value: []byte(cfg.Topic)},
		{Key: HeaderOriginalPartition, Value: []byte("0")},
		{Key: HeaderOriginalOffset, Value: []byte("0")},
	}}
	if err := a.Client().ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	buf := make([]*ackwise.Message, 1)
	if n, err := a.Receive(rctx, buf); n != 1 || err != nil {
		t.Fatalf("retry record on the reassigned partition not delivered: n=%d err=%v (paused: %v)", n, err, a.Client().PauseFetchPartitions(nil))
	}
	if buf[0].ID != "ev-back" {
		t.Fatalf("got %s", buf[0].ID)
	}
}

// TestDueRecordOfRevokingPartitionNotDelivered: a held retry record that
// comes due while its partition is being revoked is dropped with the
// partition, never handed out (the package documentation's promise for
// records fetched but not delivered).
func TestDueRecordOfRevokingPartitionNotDelivered(t *testing.T) {
	const topic = "t.retry.1s"
	s := &Source{parts: map[topicPartition]*partition{}, retries: map[string]time.Duration{topic: time.Second}}
	p := newPartition(topic, 0, true)
	s.parts[topicPartition{topic, 0}] = p
	rec := &kgo.Record{Topic: topic, Partition: 0, Offset: 5}
	seq := p.track(rec.Offset, 0, false)
	p.held = []heldRecord{{rec: rec, seq: seq, due: time.Now().Add(-time.Second)}}
	p.own.Store(ownRevoking)
	buf := make([]*ackwise.Message, 4)
	if n, _ := s.takeDue(buf, time.Now()); n != 0 {
		t.Fatalf("delivered %d held records of a revoking partition (%s)", n, buf[0].BrokerID)
	}
	if p.inflight != 0 {
		t.Fatalf("inflight %d on a revoking partition", p.inflight)
	}
}
