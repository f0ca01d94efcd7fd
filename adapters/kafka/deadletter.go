package kafka

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// A dead letter is the record with the envelope added, so a record near its
// topic's max.message.bytes (or one read from a topic with a higher limit
// than the dead-letter topic's) does not fit the dead-letter topic as it
// is. Refused for good, the dead letter would be tried again for ever and
// the record never settled. It is written trimmed instead, and marked:
// the envelope, the event ID and the key are kept; the original headers
// are kept smallest first while they fit beside the whole value; when the
// value does not fit whole, they are kept smallest first within half the
// room the envelope leaves, and the value is cut to the rest. Header
// HeaderDLQTrimmed says what was cut, with the size and SHA-256 of the
// whole value. A key or event ID too large to fit beside the envelope is
// dropped too (only a hostile producer writes those).

// fallbackDeadLetterBytes is what a dead letter is cut to when the broker
// refused it as too large and its topic's limit cannot be read.
const fallbackDeadLetterBytes = 16 << 10

// produceDeadLetter writes the dead letter of msg to topic and waits for the
// broker to confirm it, trimmed to fit the topic's max.message.bytes
// (fitDeadLetter). Refused as too large all the same (the limit was
// lowered since it was read, or could not be read), it reads the limit
// again and writes the dead letter once more, cut to it (to
// fallbackDeadLetterBytes when the limit is still not known lower).
func produceDeadLetter(ctx context.Context, cl *kgo.Client, limits *batchLimits, log *slog.Logger, topic string, msg *ackwise.Message, env dlq.Envelope) error {
	lim := limits.limit(topic)
	rec, err := fittedDeadLetter(topic, msg, env, lim, log)
	if err != nil {
		return err
	}
	err = produceOne(ctx, cl, rec)
	if !errors.Is(err, kerr.MessageTooLarge) {
		return err
	}
	sent := recordBytes(rec)
	limits.reread(ctx, cl, topic)
	lim = limits.limit(topic)
	if lim >= sent {
		lim = min(fallbackDeadLetterBytes, sent/2)
	}
	log.Warn("kafka: dead letter refused as too large for its topic; writing it trimmed", ackwise.LogKeyTopic, topic, "bytes", sent, "limit", lim, ackwise.LogKeyError, err)
	if rec, err = fittedDeadLetter(topic, msg, env, lim, log); err != nil {
		return err
	}
	return produceOne(ctx, cl, rec)
}

// fittedDeadLetter is deadLetterRecord, trimmed to fit limit bytes.
func fittedDeadLetter(topic string, msg *ackwise.Message, env dlq.Envelope, limit int, log *slog.Logger) (*kgo.Record, error) {
	rec := deadLetterRecord(topic, msg, env)
	size := recordBytes(rec)
	marker, err := fitDeadLetter(rec, limit)
	if err != nil {
		return nil, fmt.Errorf("kafka: %s: dead-letter to %s: %w", msg.BrokerID, topic, err)
	}
	if marker != "" {
		log.Warn("kafka: dead letter over its topic's max.message.bytes; written trimmed",
			ackwise.LogKeyTopic, topic, ackwise.LogKeyEventID, msg.ID, "bytes", size, "limit", limit, HeaderDLQTrimmed, marker)
	}
	return rec, nil
}

// deadLetterRecord is msg's dead letter, as it is: same key, same value,
// the original headers with env applied, and the event ID.
func deadLetterRecord(topic string, msg *ackwise.Message, env dlq.Envelope) *kgo.Record {
	h := env.Apply(msg.Headers)
	if !h.Has(ackwise.HeaderEventID) && msg.ID != "" {
		h.Set(ackwise.HeaderEventID, msg.ID)
	}
	rec := &kgo.Record{Topic: topic, Value: msg.Payload, Headers: make([]kgo.RecordHeader, 0, len(h)+1)}
	if msg.Key != "" {
		rec.Key = []byte(msg.Key)
	}
	for _, kv := range h {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: kv.Key, Value: []byte(kv.Value)})
	}
	return rec
}

// batchOverhead is what a record batch of one record adds to the record, at
// most: the v2 batch header (61 bytes, which Kafka counts against
// max.message.bytes) and the length before it in a produce request (at most
// 5 bytes, which franz-go counts against its batch limit too).
const batchOverhead = 61 + 5

// recordBytes is at least the size of rec alone in a record batch, as
// franz-go (before compression) and Kafka measure it against a topic's
// limit.
func recordBytes(rec *kgo.Record) int {
	hb := 0
	for _, h := range rec.Headers {
		hb += headerBytes(len(h.Key), len(h.Value))
	}
	return recordSize(len(rec.Key), len(rec.Value), len(rec.Headers), hb)
}

// recordSize is recordBytes of a record with a key and a value of these
// lengths and nh headers of hb bytes (headerBytes) in all. It grows with
// each argument.
func recordSize(key, value, nh, hb int) int {
	body := 1 + binary.MaxVarintLen64 + binary.MaxVarintLen32 // attributes, timestamp and offset deltas (at most)
	body += varintLen(key) + key + varintLen(value) + value + varintLen(nh) + hb
	return batchOverhead + varintLen(body) + body
}

// headerBytes is the size of a header of these key and value lengths in a
// record.
func headerBytes(key, value int) int {
	return varintLen(key) + key + varintLen(value) + value
}

func varintLen(n int) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutVarint(b[:], int64(n))
}

// trimMarker is the value of HeaderDLQTrimmed.
func trimMarker(valueBytes, valueKept int, sum []byte, headersDropped, keyDropped, idDropped int) string {
	return "value-bytes=" + strconv.Itoa(valueBytes) +
		";value-kept=" + strconv.Itoa(valueKept) +
		";value-sha256=" + hex.EncodeToString(sum) +
		";headers-dropped=" + strconv.Itoa(headersDropped) +
		";key-bytes-dropped=" + strconv.Itoa(keyDropped) +
		";event-id-bytes-dropped=" + strconv.Itoa(idDropped)
}

// fitDeadLetter trims rec, a dead letter (deadLetterRecord), in place to at
// most limit bytes (recordBytes), as the comment at the top of this file
// says, and returns the HeaderDLQTrimmed it added ("" when rec fit as it
// was). It fails only when the envelope alone does not fit: a dead-letter
// topic whose limit is below a few KiB.
func fitDeadLetter(rec *kgo.Record, limit int) (string, error) {
	if recordBytes(rec) <= limit {
		return "", nil
	}
	hs := rec.Headers
	// The envelope and the event ID stay; the marker is added. Its length
	// is bounded by the longest numbers it may carry.
	var protN, protB, idN, idB int
	var others []int // indexes of the original headers, smallest first
	for i, h := range hs {
		b := headerBytes(len(h.Key), len(h.Value))
		switch {
		case h.Key == ackwise.HeaderEventID:
			idN++
			idB += b
			fallthrough
		case strings.HasPrefix(h.Key, dlq.HeaderPrefix):
			protN++
			protB += b
		default:
			others = append(others, i)
		}
	}
	slices.SortStableFunc(others, func(a, b int) int {
		return headerBytes(len(hs[a].Key), len(hs[a].Value)) - headerBytes(len(hs[b].Key), len(hs[b].Value))
	})
	sum := sha256.Sum256(rec.Value)
	markB := headerBytes(len(HeaderDLQTrimmed), len(trimMarker(len(rec.Value), len(rec.Value), sum[:], len(hs), len(rec.Key), idB)))
	nh, hb := protN+1, protB+markB
	key, keyDropped, dropID := len(rec.Key), 0, false
	if recordSize(0, 0, nh, hb) > limit && idN > 0 {
		nh, hb, dropID = nh-idN, hb-idB, true
	}
	if recordSize(key, 0, nh, hb) > limit {
		key, keyDropped = 0, len(rec.Key)
	}
	if recordSize(key, 0, nh, hb) > limit {
		return "", fmt.Errorf("the envelope alone (%d bytes) does not fit the topic's limit of %d bytes (max.message.bytes)", recordSize(key, 0, nh, hb), limit)
	}
	value := len(rec.Value)
	room := limit // what the original headers may take
	if recordSize(key, value, nh, hb) > limit {
		// The value is cut: the headers get at most half the room the
		// envelope leaves, the value the rest.
		value = 0
		room = recordSize(key, 0, nh, hb) + (limit-recordSize(key, 0, nh, hb))/2
	}
	keep := make([]bool, len(hs))
	dropped := 0
	for _, i := range others {
		b := headerBytes(len(hs[i].Key), len(hs[i].Value))
		if recordSize(key, value, nh+1, hb+b) <= room {
			keep[i] = true
			nh, hb = nh+1, hb+b
		} else {
			dropped++
		}
	}
	if value < len(rec.Value) {
		// The most of the value that fits beside what is kept.
		value = limit - recordSize(key, 0, nh, hb)
		for value > 0 && recordSize(key, value, nh, hb) > limit {
			value--
		}
		value = max(0, min(value, len(rec.Value)))
	}
	idDropped := 0
	out := hs[:0:0]
	for i, h := range hs {
		switch {
		case h.Key == ackwise.HeaderEventID && dropID:
			idDropped += len(h.Value)
		case keep[i] || h.Key == ackwise.HeaderEventID || strings.HasPrefix(h.Key, dlq.HeaderPrefix):
			out = append(out, h)
		}
	}
	marker := trimMarker(len(rec.Value), value, sum[:], dropped, keyDropped, idDropped)
	rec.Headers = append(out, kgo.RecordHeader{Key: HeaderDLQTrimmed, Value: []byte(marker)})
	rec.Value = rec.Value[:value]
	if keyDropped > 0 {
		rec.Key = nil
	}
	if n := recordBytes(rec); n > limit {
		// Cannot happen: every part was sized above.
		return "", fmt.Errorf("trimmed dead letter of %d bytes over the topic's limit of %d bytes", n, limit)
	}
	return marker, nil
}
