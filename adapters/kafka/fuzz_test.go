package kafka

import (
	"bytes"
	"cmp"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// fuzzHeaders splits data into record headers: key NUL value NUL key ...
func fuzzHeaders(data []byte) []kgo.RecordHeader {
	parts := bytes.Split(data, []byte{0})
	var hs []kgo.RecordHeader
	for i := 0; i+1 < len(parts); i += 2 {
		hs = append(hs, kgo.RecordHeader{Key: string(parts[i]), Value: parts[i+1]})
	}
	return hs
}

// FuzzHopHeaders: the source reads a record's headers (attempt, first
// failure, retry due and group, original topic/partition/offset, event ID)
// from any list a producer may write, on the main topic and on a retry
// topic, without panicking, and the message it builds holds:
//   - on the main topic, attempt 1, no first failure, the record's own
//     topic/partition/offset, whatever the headers say; on a retry topic, an
//     attempt in [1, maxAttempt] and a non-negative partition and offset;
//   - the last ackwise-event-id as the ID;
//   - every header but those the hop consumes, in order, byte for byte;
//   - a next hop's attempt in [2, maxAttempt].
func FuzzHopHeaders(f *testing.F) {
	hs := func(kv ...string) []byte { return []byte(strings.Join(kv, "\x00") + "\x00") }
	f.Add(hs(ackwise.HeaderAttempt, "1000000000", ackwise.HeaderEventID, "ev"), false, int32(0), int64(5))
	f.Add(hs(ackwise.HeaderAttempt, "9223372036854775807", HeaderRetryGroup, "g", HeaderRetryDue, "0"), true, int32(1), int64(7))
	f.Add(hs(ackwise.HeaderAttempt, "+3", HeaderOriginalPartition, "-1", HeaderOriginalOffset, "99999999999999999999"), true, int32(0), int64(0))
	f.Add(hs(HeaderOriginalTopic, "payments", HeaderOriginalPartition, "7", HeaderOriginalOffset, "12", ackwise.HeaderFirstFailure, "2020-01-02T03:04:05Z"), true, int32(2), int64(3))
	f.Add(hs(ackwise.HeaderEventID, "a", "x", "", ackwise.HeaderEventID, "b", HeaderRetryDue, "-5"), false, int32(0), int64(1))
	f.Fuzz(func(t *testing.T, data []byte, retry bool, partition int32, offset int64) {
		partition, offset = max(partition, 0), max(offset, 0)
		const topic = "orders"
		rtopic := topic
		if retry {
			rtopic = "orders.retry.1m"
		}
		r := &kgo.Record{Topic: rtopic, Partition: partition, Offset: offset, Key: []byte("k"), Value: []byte("v"), Headers: fuzzHeaders(data)}
		var s Source
		p := newPartition(rtopic, partition, retry)
		m := s.message(p, r, 0, 0)
		due, group, tagged := retryHeaders(r)

		wantID, wantTagged, wantGroup := "", false, ""
		var wantHeaders ackwise.Headers
		for _, h := range r.Headers {
			switch h.Key {
			case ackwise.HeaderEventID:
				wantID = string(h.Value)
			case HeaderRetryGroup:
				wantTagged, wantGroup = true, string(h.Value)
			}
			switch h.Key {
			case HeaderRetryDue, HeaderRetryGroup:
				continue
			case HeaderOriginalTopic, HeaderOriginalPartition, HeaderOriginalOffset:
				if retry {
					continue
				}
			}
			wantHeaders = append(wantHeaders, ackwise.Header{Key: h.Key, Value: string(h.Value)})
		}
		if m.ID != wantID || tagged != wantTagged || group != wantGroup {
			t.Fatalf("ID %q group %q tagged %v, want %q %q %v", m.ID, group, tagged, wantID, wantGroup, wantTagged)
		}
		if len(m.Headers) != len(wantHeaders) {
			t.Fatalf("headers %q, want %q", m.Headers, wantHeaders)
		}
		for i := range wantHeaders {
			if m.Headers[i] != wantHeaders[i] {
				t.Fatalf("headers %q, want %q", m.Headers, wantHeaders)
			}
		}
		if m.BrokerID != rtopic+"/"+strconv.Itoa(int(partition))+"@"+strconv.FormatInt(offset, 10) {
			t.Fatalf("broker ID %q", m.BrokerID)
		}
		if m.Attempt < 1 || m.Attempt > maxAttempt {
			t.Fatalf("attempt %d", m.Attempt)
		}
		if n := nextAttempt(m.Attempt); n < 2 || n > maxAttempt {
			t.Fatalf("next attempt after %d: %d", m.Attempt, n)
		}
		if !retry {
			if m.Attempt != 1 || !m.FirstFailure.IsZero() || m.Source != topic || m.Partition != partition || m.Offset != offset {
				t.Fatalf("main topic: attempt %d first failure %v at %s/%d@%d", m.Attempt, m.FirstFailure, m.Source, m.Partition, m.Offset)
			}
		} else if m.Partition < 0 || m.Offset < 0 {
			t.Fatalf("retry topic: at %s/%d@%d", m.Source, m.Partition, m.Offset)
		}
		if !due.IsZero() && due.Before(time.UnixMilli(0)) {
			t.Fatalf("due %v before the epoch", due)
		}
	})
}

// FuzzParseURL: ParseURL and ParseSinkURL take any kafka:// URL a user may
// write, with a password holding any characters, unescaped, without
// panicking or hanging; their errors never show the password, nor any
// piece of it (marked by the tokens around and inside it), and name no Go
// field; and a config they return passes the constructors' validation (a
// URL's mistakes are reported by the URL parser, naming the parameter).
func FuzzParseURL(f *testing.F) {
	f.Add("alice", "12345?S3CRET", "h1:9092/orders?group=g")
	f.Add("alice", "s/ecret", "h1:9092,h2:9092/orders?group=g&tiers=1m,10m&sasl=plain")
	f.Add("bob", "p@ss#word", "h:9092/t?group=g&sasl=scram-sha-512&tls=true")
	f.Add("", "", "h:9092/t?tls_ca=/nonexistent&tls=false")
	f.Add("u", "x&y=z", "h:9092/t?group=g&poll_batch=-1&fetch_max_bytes=99999999999")
	f.Add("u", "a%zz", "h:9092/t?revoke_timeout=-1&commit_interval=1x")
	f.Add("u", "p", "h:9092/t?group=g&session_timeout=6s&rebalance_timeout=12s&heartbeat_interval=500ms&revoke_timeout=11s")
	f.Add("u", "p", "h:9092/t.a?group=g&tiers=1s,1m&retry_prefix=t_a.&dlq=t_a.1s&start=LATEST")
	f.Fuzz(func(t *testing.T, user, pass, rest string) {
		const a, b, c = "Pw1q", "Qx7K", "Zr5m" // tokens no error text holds
		for _, s := range []string{user, pass, rest} {
			if strings.Contains(s, a[:2]) || strings.Contains(s, b[:2]) || strings.Contains(s, c[:2]) {
				return // a token's piece outside the password: not telling
			}
		}
		half := len(pass) / 2
		secret := a + pass[:half] + b + pass[half:] + c
		raw := "kafka://" + user + ":" + secret + "@" + rest
		u, err := url.Parse(raw)
		if err != nil {
			return // adapters.Open refuses it without showing it
		}
		parseSink := func(u *url.URL) error {
			cfg, err := ParseSinkURL(u)
			if err == nil {
				cfg.ClientConfig = cfg.ClientConfig.withDefaults()
				return cfg.ClientConfig.validate(fieldsOf("SinkConfig"), cfg.Topic)
			}
			return err
		}
		parseSource := func(u *url.URL) error {
			cfg, err := ParseURL(u)
			if err == nil {
				cfg.Group = cmp.Or(cfg.Group, "g") // required only to open a source
				return cfg.withDefaults().validate()
			}
			return err
		}
		for _, parse := range []func(*url.URL) error{parseSource, parseSink} {
			err := parse(u)
			if err == nil {
				continue
			}
			msg := err.Error()
			if strings.Contains(msg, "Config.") {
				t.Fatalf("%s: %v: a URL's error names a Go field", raw, err)
			}
			for _, tok := range []string{a, b, c} {
				if strings.Contains(msg, tok) {
					t.Fatalf("%s: error shows part of the password: %v", raw, err)
				}
			}
		}
	})
}
