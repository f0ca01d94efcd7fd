package kafka

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// dlqSizeCase is a record a handler fails on, and where its dead letter
// must go.
type dlqSizeCase struct {
	name  string
	share bool
	tiers []time.Duration // RetryBroker mode with these tiers; the handler's error transient
	// limits are the max.message.bytes of the dead-letter topic (dlq) and
	// of the retry topic (retry), 0 to keep the broker's default; set
	// before the source opens, but for late, set after.
	dlq, retry int
	late       bool
	value      int // bytes of the record's value
	headers    []kgo.RecordHeader
	check      func(t *testing.T, dl *kgo.Record, value []byte, env dlq.Envelope)
}

// TestDeadLetterNearMaxMessageBytes: a record whose dead letter (the record
// with the envelope) does not fit the dead-letter topic is dead-lettered
// once, trimmed with the ackwise-dlq-trimmed marker, not tried again for
// ever: its largest original headers are dropped when the value fits whole;
// the value is cut (size and SHA-256 of the whole value in the marker) when
// it does not; also with the limit lowered after the source read it, on a
// share source, and for a record as large as the broker's default limit
// takes (issue 17: 1,048,528 bytes of value). A record whose retry copy does not fit its retry
// topic is dead-lettered (reason unroutable) instead of moved. Before, each
// dead letter (each move) was refused as MESSAGE_TOO_LARGE and tried again
// in place every 5s, for ever: the test ran out of its deadline.
func TestDeadLetterNearMaxMessageBytes(t *testing.T) {
	t.Parallel()
	big := kgo.RecordHeader{Key: "big", Value: bytes.Repeat([]byte("b"), 900)}
	small := kgo.RecordHeader{Key: "small", Value: []byte("s")}
	cut := func(limit int) func(t *testing.T, dl *kgo.Record, value []byte, env dlq.Envelope) {
		return func(t *testing.T, dl *kgo.Record, value []byte, env dlq.Envelope) {
			if env.Reason != dlq.ReasonPermanent {
				t.Errorf("reason %s, want permanent", env.Reason)
			}
			m := trimmedMarker(t, dl)
			kept := len(dl.Value)
			if kept == 0 || kept >= len(value) || !bytes.Equal(dl.Value, value[:kept]) {
				t.Errorf("dead letter value of %d bytes, want a prefix of the %d-byte value", kept, len(value))
			}
			sum := sha256.Sum256(value)
			if m["value-bytes"] != strconv.Itoa(len(value)) || m["value-kept"] != strconv.Itoa(kept) || m["value-sha256"] != hex.EncodeToString(sum[:]) {
				t.Errorf("marker %v: want value-bytes=%d value-kept=%d and the value's SHA-256", m, len(value), kept)
			}
			if got := recordBytes(dl); got > limit {
				t.Errorf("dead letter of %d bytes over the limit %d", got, limit)
			}
			if h := headerValue(dl, "small"); h != "s" {
				t.Errorf("small original header %q, want kept", h)
			}
		}
	}
	unmovable := func(why string) func(t *testing.T, dl *kgo.Record, value []byte, env dlq.Envelope) {
		return func(t *testing.T, dl *kgo.Record, value []byte, env dlq.Envelope) {
			if env.Reason != dlq.ReasonUnroutable || !strings.Contains(env.Error, why) {
				t.Errorf("reason %s error %q, want unroutable: %s", env.Reason, env.Error, why)
			}
			if !bytes.Equal(dl.Value, value) || headerValue(dl, HeaderDLQTrimmed) != "" || headerValue(dl, "small") != "s" {
				t.Errorf("dead letter trimmed: %d of %d bytes, headers %d", len(dl.Value), len(value), len(dl.Headers))
			}
		}
	}
	cases := []dlqSizeCase{
		{name: "headers-dropped", dlq: 4096, value: 3000, headers: []kgo.RecordHeader{small, big},
			check: func(t *testing.T, dl *kgo.Record, value []byte, env dlq.Envelope) {
				if !bytes.Equal(dl.Value, value) {
					t.Errorf("value of %d bytes, want the whole %d", len(dl.Value), len(value))
				}
				if headerValue(dl, "big") != "" || headerValue(dl, "small") != "s" {
					t.Errorf("headers %v: want big dropped, small kept", dl.Headers)
				}
				if m := trimmedMarker(t, dl); m["headers-dropped"] != "1" || m["value-kept"] != "3000" {
					t.Errorf("marker %v", m)
				}
			}},
		{name: "value-cut", dlq: 4096, value: 4000, headers: []kgo.RecordHeader{small}, check: cut(4096)},
		{name: "limit-lowered-after-open", dlq: 4096, late: true, value: 4000, headers: []kgo.RecordHeader{small}, check: cut(4096)},
		{name: "share", share: true, dlq: 4096, value: 4000, headers: []kgo.RecordHeader{small}, check: cut(4096)},
		{name: "near-default-limit", value: -1, headers: []kgo.RecordHeader{small}, check: cut(defMaxMessageBytes)},
		{name: "retry-copy-too-large", tiers: []time.Duration{20 * time.Millisecond}, retry: 4096, value: 4000, headers: []kgo.RecordHeader{small},
			check: unmovable("does not fit retry topic")},
		{name: "retry-limit-lowered-after-open", tiers: []time.Duration{20 * time.Millisecond}, retry: 4096, late: true, value: 4000, headers: []kgo.RecordHeader{small},
			check: unmovable("MESSAGE_TOO_LARGE")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			deadLetterSize(t, tc)
		})
	}
}

// defMaxMessageBytes is kfake's default max.message.bytes (Kafka's
// message.max.bytes default).
const defMaxMessageBytes = 1048588

func deadLetterSize(t *testing.T, tc dlqSizeCase) {
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1, tc.tiers...)
	d := cfg.withDefaults()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	setLimits := func() {
		if tc.dlq > 0 {
			setMaxMessageBytes(ctx, t, brokers, d.DeadLetterTopic, tc.dlq)
		}
		if tc.retry > 0 {
			setMaxMessageBytes(ctx, t, brokers, d.RetryTopic(d.Topic, tc.tiers[0]), tc.retry)
		}
	}
	if !tc.late {
		setLimits()
	}
	rec := &kgo.Record{Topic: cfg.Topic, Key: []byte("k"),
		Headers: append([]kgo.RecordHeader{{Key: ackwise.HeaderEventID, Value: []byte("ev-big")}}, tc.headers...)}
	n := tc.value
	if n < 0 { // as large as the topic takes (recordBytes is at least the size)
		n = defMaxMessageBytes - recordBytes(rec)
	}
	value := incompressible(n)
	rec.Value = value
	// Straight through a client that takes records as large as the
	// topic does.
	pcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerBatchMaxBytes(defMaxMessageBytes))
	if err != nil {
		t.Fatal(err)
	}
	defer pcl.Close()
	if err := pcl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var inner adapters.Source
	if tc.share {
		inner = openShare(t, cfg)
	} else {
		inner = openSource(t, cfg)
	}
	if tc.late {
		setLimits()
	}
	ccfg := consumer.Config{Retry: retry.Policy{MaxAttempts: 3, InitialInterval: 10 * time.Millisecond, Jitter: retry.NoJitter}}
	fail := errors.New("transient failure")
	if len(tc.tiers) == 0 {
		fail = ackwise.Permanent(errors.New("poison"))
	} else {
		ccfg.RetryMode = consumer.RetryBroker
	}
	runConsumer(t, inner, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return fail }), ccfg)
	// The dead letter, as soon as it is written.
	rcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(d.DeadLetterTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer rcl.Close()
	for len(rcl.PollFetches(ctx).Records()) == 0 {
		if ctx.Err() != nil {
			t.Fatal("not dead-lettered before the deadline (the dead letter or the move refused as too large, tried again for ever?)")
		}
	}
	dls := readAll(ctx, t, brokers, d.DeadLetterTopic)
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	dl := dls[0]
	if string(dl.Key) != "k" || headerValue(dl, ackwise.HeaderEventID) != "ev-big" {
		t.Errorf("dead letter key %q event ID %q, want k and ev-big", dl.Key, headerValue(dl, ackwise.HeaderEventID))
	}
	env, err := dlq.Decode(recordMessage(dl).Headers)
	if err != nil {
		t.Errorf("envelope read back: %v", err)
	}
	tc.check(t, dl, value, env)
}

// headerValue is the last value of header key in r, "" when none.
func headerValue(r *kgo.Record, key string) string {
	v := ""
	for _, h := range r.Headers {
		if h.Key == key {
			v = string(h.Value)
		}
	}
	return v
}

// trimmedMarker reads the ackwise-dlq-trimmed header of r into its fields.
func trimmedMarker(t *testing.T, r *kgo.Record) map[string]string {
	t.Helper()
	v := headerValue(r, HeaderDLQTrimmed)
	if v == "" {
		t.Fatalf("no %s header on the dead letter", HeaderDLQTrimmed)
	}
	m := map[string]string{}
	for _, f := range strings.Split(v, ";") {
		k, val, _ := strings.Cut(f, "=")
		m[k] = val
	}
	return m
}
