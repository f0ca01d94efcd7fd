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
	"github.com/ackwise/ackwise/dlq"
)

// TestRecordBytesBound: recordBytes is at least what franz-go and the
// broker measure: records of several shapes (no key, headers around the
// varint boundaries, many headers) grown to recordBytes == the limit (or
// one below, where a varint grows) are taken by a client and a topic with
// that limit.
func TestRecordBytesBound(t *testing.T) {
	t.Parallel()
	brokers := newCluster(t)
	cfg := testConfig(t, brokers, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const limit = 20000
	setMaxMessageBytes(ctx, t, brokers, cfg.Topic, limit)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerBatchMaxBytes(limit), kgo.DefaultProduceTopic(cfg.Topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	hdrs := func(n, size int) []kgo.RecordHeader {
		var hs []kgo.RecordHeader
		for i := range n {
			hs = append(hs, kgo.RecordHeader{Key: "h" + strconv.Itoa(i), Value: bytes.Repeat([]byte("v"), size)})
		}
		return hs
	}
	shapes := []*kgo.Record{
		{},
		{Key: []byte("k")},
		{Key: bytes.Repeat([]byte("k"), 64), Headers: hdrs(1, 63)},
		{Headers: hdrs(3, 64)},
		{Key: []byte("key"), Headers: hdrs(64, 10)},
		{Headers: hdrs(1, 8192)},
	}
	for i, rec := range shapes {
		n := limit - recordBytes(rec)
		rec.Value = incompressible(n)
		for recordBytes(rec) > limit {
			n--
			rec.Value = rec.Value[:n]
		}
		if got := recordBytes(rec); got < limit-1 {
			t.Fatalf("shape %d: grown to %d bytes only", i, got)
		}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Errorf("shape %d of recordBytes %d, limit %d: %v", i, recordBytes(rec), limit, err)
		}
	}
}

// envelopeFor is a typical envelope.
func envelopeFor(msg *ackwise.Message) dlq.Envelope {
	return dlq.New(msg, dlq.ReasonPermanent, errors.New("poison"), ackwise.ClassPermanent, time.Now(), "billing", "v1.2.3")
}

// checkFitted checks the trimmed dead letter rec of msg against limit:
// within it; the envelope and event ID kept; the value a prefix of the
// payload and the original headers kept in order, a subsequence of msg's;
// and the marker saying what was cut.
func checkFitted(t *testing.T, msg *ackwise.Message, rec *kgo.Record, limit int, marker string) {
	t.Helper()
	if got := recordBytes(rec); got > limit {
		t.Fatalf("%d bytes over the limit %d", got, limit)
	}
	if !bytes.HasPrefix(msg.Payload, rec.Value) {
		t.Fatalf("value of %d bytes is not a prefix of the payload", len(rec.Value))
	}
	var env, orig []kgo.RecordHeader
	for _, h := range rec.Headers {
		switch {
		case strings.HasPrefix(h.Key, dlq.HeaderPrefix):
			env = append(env, h)
		default:
			orig = append(orig, h)
		}
	}
	m := &ackwise.Message{Headers: ackwise.Headers{}}
	for _, h := range env {
		m.Headers = append(m.Headers, ackwise.Header{Key: h.Key, Value: string(h.Value)})
	}
	if _, err := dlq.Decode(m.Headers); err != nil {
		t.Fatalf("envelope: %v", err)
	}
	// The original headers kept are a subsequence of the message's.
	j := 0
	for _, h := range orig {
		for j < len(msg.Headers) && (msg.Headers[j].Key != h.Key || msg.Headers[j].Value != string(h.Value)) {
			j++
		}
		if j == len(msg.Headers) && !(h.Key == ackwise.HeaderEventID && string(h.Value) == msg.ID) {
			t.Fatalf("header %q=%q not the message's, or out of order", h.Key, h.Value)
		}
		j = min(j+1, len(msg.Headers))
	}
	if marker == "" {
		if !bytes.Equal(rec.Value, msg.Payload) || m.Headers.Has(HeaderDLQTrimmed) {
			t.Fatal("cut without a marker")
		}
		return
	}
	if got := m.Headers.Get(HeaderDLQTrimmed); got != marker {
		t.Fatalf("marker header %q, returned %q", got, marker)
	}
	f := map[string]string{}
	for _, kv := range strings.Split(marker, ";") {
		k, v, _ := strings.Cut(kv, "=")
		f[k] = v
	}
	sum := sha256.Sum256(msg.Payload)
	if f["value-bytes"] != strconv.Itoa(len(msg.Payload)) || f["value-kept"] != strconv.Itoa(len(rec.Value)) || f["value-sha256"] != hex.EncodeToString(sum[:]) {
		t.Fatalf("marker %q: value %d of %d bytes", marker, len(rec.Value), len(msg.Payload))
	}
	if id := f["event-id-bytes-dropped"]; id == "0" && msg.ID != "" && headerOf(rec, ackwise.HeaderEventID) != msg.ID {
		t.Fatalf("event ID %q lost, marker %q", headerOf(rec, ackwise.HeaderEventID), marker)
	}
	if k := f["key-bytes-dropped"]; (k == "0") != (string(rec.Key) == msg.Key) {
		t.Fatalf("key %q of %q, marker %q", rec.Key, msg.Key, marker)
	}
}

func headerOf(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestFitDeadLetter: trimming keeps what it promises (checkFitted), drops
// the largest original headers first while the value fits whole, cuts the
// value when it does not, and drops a key or an event ID only when it
// alone does not fit beside the envelope.
func TestFitDeadLetter(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("b", 900)
	for _, tc := range []struct {
		name    string
		msg     *ackwise.Message
		limit   int
		trimmed bool
		want    func(*kgo.Record) string // "" when as wanted
	}{
		{name: "fits", msg: &ackwise.Message{ID: "e", Key: "k", Payload: []byte("v"), Headers: ackwise.HeadersOf("a", "1")}, limit: 4096},
		{name: "largest-header-first", trimmed: true, limit: 4096,
			msg: &ackwise.Message{ID: "e", Key: "k", Payload: make([]byte, 2600), Headers: ackwise.HeadersOf("a", "1", "big", big, "mid", strings.Repeat("m", 300))},
			want: func(r *kgo.Record) string {
				if headerOf(r, "big") != "" || headerOf(r, "a") != "1" || len(r.Value) != 2600 {
					return "want big dropped, a kept, value whole"
				}
				return ""
			}},
		{name: "value-cut", trimmed: true, limit: 4096,
			msg: &ackwise.Message{ID: "e", Key: "k", Payload: make([]byte, 5000), Headers: ackwise.HeadersOf("a", "1", "big", strings.Repeat("b", 3000))},
			want: func(r *kgo.Record) string {
				if headerOf(r, "big") != "" || headerOf(r, "a") != "1" || len(r.Value) < 1000 {
					return "want big dropped (over half the room), a kept, the value cut to the rest"
				}
				return ""
			}},
		{name: "huge-key", trimmed: true, limit: 4096,
			msg: &ackwise.Message{ID: "e", Key: strings.Repeat("k", 5000), Payload: []byte("v")},
			want: func(r *kgo.Record) string {
				if r.Key != nil || string(r.Value) != "v" {
					return "want the key dropped, the value kept"
				}
				return ""
			}},
		{name: "huge-event-id", trimmed: true, limit: 4096,
			msg: &ackwise.Message{ID: strings.Repeat("e", 5000), Key: "k", Payload: []byte("v")},
			want: func(r *kgo.Record) string {
				if headerOf(r, ackwise.HeaderEventID) != "" || string(r.Key) != "k" {
					return "want the event ID dropped, the key kept"
				}
				return ""
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := deadLetterRecord("t.dlq", tc.msg, envelopeFor(tc.msg))
			marker, err := fitDeadLetter(rec, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			if (marker != "") != tc.trimmed {
				t.Fatalf("marker %q, want trimmed %v", marker, tc.trimmed)
			}
			checkFitted(t, tc.msg, rec, tc.limit, marker)
			if tc.want != nil {
				if why := tc.want(rec); why != "" {
					t.Errorf("%s: key %d bytes, value %d, headers %v", why, len(rec.Key), len(rec.Value), rec.Headers)
				}
			}
		})
	}
	// The envelope alone over the limit: an error, not a loop.
	msg := &ackwise.Message{ID: "e", Payload: []byte("v")}
	if _, err := fitDeadLetter(deadLetterRecord("t.dlq", msg, envelopeFor(msg)), 200); err == nil {
		t.Error("an envelope over a limit of 200 bytes fitted")
	}
}

// FuzzFitDeadLetter: whatever a producer put in a record (key, value,
// headers, event ID) and whatever the limit, a dead letter is trimmed to
// the limit keeping what checkFitted checks, or refused only when the
// envelope alone is over the limit.
func FuzzFitDeadLetter(f *testing.F) {
	f.Add("k", 10, 100, "a\x00b\x00big\x00"+strings.Repeat("x", 900), 4096, "ev")
	f.Add("", 5000, 0, "", 4096, "")
	f.Add(strings.Repeat("k", 3000), 3000, 64, "h\x00v", 4096, strings.Repeat("e", 3000))
	f.Add("k", 1<<20, 0, "", 1<<20, "ev")
	f.Fuzz(func(t *testing.T, key string, value, hsize int, hdrs string, limit int, id string) {
		value, hsize, limit = min(max(value, 0), 1<<21), min(max(hsize, 0), 1<<16), min(max(limit, 512), 1<<21)
		msg := &ackwise.Message{ID: id, Key: key, Payload: bytes.Repeat([]byte{'v'}, value)}
		parts := strings.Split(hdrs, "\x00")
		for i := 0; i+1 < len(parts); i += 2 {
			msg.Headers = append(msg.Headers, ackwise.Header{Key: parts[i], Value: parts[i+1] + strings.Repeat("h", hsize)})
		}
		env := envelopeFor(&ackwise.Message{Source: "t", BrokerID: "t/0@1"})
		rec := deadLetterRecord("t.dlq", msg, env)
		marker, err := fitDeadLetter(rec, limit)
		if err != nil {
			// Only the envelope itself may not fit.
			bare := deadLetterRecord("t.dlq", &ackwise.Message{}, env)
			if recordBytes(bare)+300 <= limit {
				t.Fatalf("limit %d, envelope of %d bytes: %v", limit, recordBytes(bare), err)
			}
			return
		}
		checkFitted(t, msg, rec, limit, marker)
	})
}
