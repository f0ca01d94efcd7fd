// Package row holds what the outbox stores share: how a message is made
// ready to be stored, and the encoding of its headers.
package row

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/producer/outbox"
)

// Prepare makes msg ready to be stored: it gives it an event ID (a UUIDv7)
// when it has none, as producer.Publish would, and returns its headers with
// the trace context of ctx written in (producer.InjectTrace) and the event
// ID header left out (the row keeps the ID in a column of its own). The
// caller's headers are not changed.
func Prepare(ctx context.Context, msg *ackwise.Message) (ackwise.Headers, error) {
	if msg == nil {
		return nil, errors.New("message is nil")
	}
	if id := msg.EventID(); id == "" {
		msg.ID = producer.NewEventID()
	} else if msg.ID == "" {
		msg.ID = id
	}
	c := &ackwise.Message{Headers: msg.Headers.Clone()}
	c.Headers.Del(ackwise.HeaderEventID)
	producer.InjectTrace(ctx, c)
	return c.Headers, nil
}

// EncodeHeaders encodes h losslessly (any bytes, repeated keys, order): a
// uvarint count, then each key and value as a uvarint length and its
// bytes. No headers encode as nil.
func EncodeHeaders(h ackwise.Headers) []byte {
	if len(h) == 0 {
		return nil
	}
	n := binary.MaxVarintLen64
	for _, kv := range h {
		n += 2*binary.MaxVarintLen64 + len(kv.Key) + len(kv.Value)
	}
	b := make([]byte, 0, n)
	b = binary.AppendUvarint(b, uint64(len(h)))
	for _, kv := range h {
		b = binary.AppendUvarint(b, uint64(len(kv.Key)))
		b = append(b, kv.Key...)
		b = binary.AppendUvarint(b, uint64(len(kv.Value)))
		b = append(b, kv.Value...)
	}
	return b
}

// DecodeHeaders decodes what EncodeHeaders encoded.
func DecodeHeaders(b []byte) (ackwise.Headers, error) {
	if len(b) == 0 {
		return nil, nil
	}
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, errors.New("outbox: corrupt headers: bad count")
	}
	b = b[k:]
	h := make(ackwise.Headers, 0, n)
	str := func() (string, error) {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return "", errors.New("outbox: corrupt headers: bad length")
		}
		s := string(b[k : k+int(l)])
		b = b[k+int(l):]
		return s, nil
	}
	for range n {
		key, err := str()
		if err != nil {
			return nil, err
		}
		val, err := str()
		if err != nil {
			return nil, err
		}
		h = append(h, ackwise.Header{Key: key, Value: val})
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("outbox: corrupt headers: %d trailing bytes", len(b))
	}
	return h, nil
}

// Rows is what pgx.Rows and *sql.Rows share.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// ReadClaimed reads the rows a claim returned, each with the columns id,
// event_id, key, headers, payload, created_at and attempts (created_at
// scanned into a C and turned into a time by createdAt), and returns them
// in id order. A row whose headers do not decode is returned with Row.Err
// set (and no headers), not as an error: the relay parks it.
func ReadClaimed[C any](rows Rows, createdAt func(C) time.Time) ([]outbox.Row, error) {
	var out []outbox.Row
	for rows.Next() {
		var (
			r        outbox.Row
			m        ackwise.Message
			key, hdr []byte
			created  C
		)
		if err := rows.Scan(&r.ID, &m.ID, &key, &hdr, &m.Payload, &created, &r.Attempts); err != nil {
			return nil, err
		}
		m.Key = string(key)
		var err error
		if m.Headers, err = DecodeHeaders(hdr); err != nil {
			r.Err = fmt.Errorf("row %d: %w", r.ID, err)
		}
		r.CreatedAt = createdAt(created)
		r.Message = &m
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b outbox.Row) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}
