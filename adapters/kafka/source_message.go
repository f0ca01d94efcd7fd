package kafka

import (
	"bytes"
	"math"
	"strconv"
	"time"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ackwise/ackwise"
)

// retryHeaders reads, in one pass, what a retry topic's record says of its
// hop: when it is due (zero when unset or unreadable), and the group that
// moved it (tagged false for a record moved by an ackwise before it set
// HeaderRetryGroup: it counts as the reader's own).
func retryHeaders(r *kgo.Record) (due time.Time, group string, tagged bool) {
	for _, h := range r.Headers {
		switch h.Key {
		case HeaderRetryDue:
			if ms, ok := parseCount(string(h.Value)); ok {
				due = time.UnixMilli(ms)
			}
		case HeaderRetryGroup:
			group, tagged = string(h.Value), true
		}
	}
	return due, group, tagged
}

// maxAttempt caps the attempt number read from a retry topic's
// ackwise-attempt and written to the next hop (ackwise.MaxAttempt).
const maxAttempt = ackwise.MaxAttempt

// parseCount reads a non-negative decimal number written by this package
// (an attempt, a partition, an offset, Unix milliseconds): ASCII digits
// only, no sign, no spaces, at most 19 of them, within int64.
func parseCount(v string) (int64, bool) {
	if len(v) == 0 || len(v) > 19 {
		return 0, false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

// parseAttempt reads ackwise-attempt: a count of at least 1, capped at
// maxAttempt.
func parseAttempt(v string) (int, bool) {
	n, ok := parseCount(v)
	if !ok || n < 1 {
		return 0, false
	}
	return int(min(n, maxAttempt)), true
}

// nextAttempt is the ackwise-attempt of the next hop of a message at
// attempt: one more, from at least 1, saturating at maxAttempt.
func nextAttempt(attempt int) int {
	return min(max(attempt, 1), maxAttempt-1) + 1
}

// message builds the Message of a record. Called by the goroutine calling
// Receive (it uses s.strs, the slabs and the recycled deliveries). The key,
// the header values and the broker ID are strings carved from a shared,
// append-only chunk (see strChunk); the Message, its receipt and its headers
// are carved from slabs or recycled.
func (s *Source) message(p *partition, r *kgo.Record, seq int64, gen uint16) *ackwise.Message {
	if len(s.local) == 0 {
		s.freeMu.Lock()
		s.local, s.freed = s.freed, s.local
		s.freeMu.Unlock()
	}
	var d *delivery
	if n := len(s.local); n > 0 {
		d = s.local[n-1]
		// Cleared: a message its user drops without recycling must not
		// stay reachable from here, with the fetch its Payload points into.
		s.local[n-1] = nil
		s.local = s.local[:n-1]
	} else {
		// One allocation per 64 records instead of one per record. A
		// slab lives as long as any delivery in it is referenced.
		if len(s.slab) == 0 {
			s.slab = make([]delivery, 64)
		}
		d = &s.slab[0]
		s.slab = s.slab[1:]
	}

	// s.strs is written back once, below: each write of it is a write
	// barrier while the garbage collector marks.
	strs := carver{s.strs}
	var key, id string
	if len(r.Key) > 0 {
		key = strs.carve(r.Key)
	}
	src, part, off, attempt := r.Topic, r.Partition, r.Offset, 1
	var firstFailure time.Time
	var h ackwise.Headers
	if n := len(r.Headers); n > 0 {
		// Full slice expressions: an append by the handler reallocates
		// instead of writing over another message's headers.
		if n <= len(d.hdrs) {
			h = d.hdrs[:0:n]
		} else {
			if len(s.hslab) < n {
				s.hslab = make([]ackwise.Header, max(256, n))
			}
			h = s.hslab[:0:n]
			s.hslab = s.hslab[n:]
		}
		for _, kv := range r.Headers {
			k := kv.Key // franz-go already made it a string
			v := strs.carve(kv.Value)
			// Every header read here is named ackwise-...: the others
			// skip the switch.
			if len(k) > len(headerPrefix) && k[:len(headerPrefix)] == headerPrefix {
				if k == ackwise.HeaderEventID {
					id = v // the last one wins, as with Headers.Get
				} else if skip := s.hopHeader(p, k, v, &src, &part, &off, &attempt, &firstFailure); skip {
					continue
				}
			}
			h = append(h, ackwise.Header{Key: k, Value: v})
		}
		h = h[:len(h):len(h)]
	}
	brokerID := strs.carve(p.brokerID(r.Offset))
	s.strs = strs.b
	// Every field is set: a recycled delivery holds the last message's.
	// Field by field, and pointers only where they changed: while the
	// garbage collector marks, each pointer written costs a write barrier
	// (a whole-struct assignment pays one for every pointer slot).
	d.rc.seq, d.rc.gen = seq, gen
	d.detached = false
	if d.rc.p != p {
		d.rc.p = p
	}
	if d.rc.d != d {
		d.rc.d = d
	}
	m := &d.msg
	m.ID = id
	m.Key = key
	m.Payload = r.Value
	m.Headers = h
	if m.Source != src {
		m.Source = src
	}
	m.Partition = part
	m.Offset = off
	m.BrokerID = brokerID
	m.Attempt = attempt
	m.PublishedAt = r.Timestamp
	if m.FirstFailure != firstFailure {
		m.FirstFailure = firstFailure
	}
	if rc, ok := m.Handle.(*receipt); !ok || rc != &d.rc {
		m.Handle = &d.rc
	}
	return m
}

// headerPrefix begins the name of every header message reads.
const headerPrefix = "ackwise-"

// hopHeader reads header k (value v) of a record of p other than the event
// ID into what message builds, and reports whether the header is dropped
// from the message: the headers of a retry topic's hop, which describe the
// hop, not the message.
func (s *Source) hopHeader(p *partition, k, v string, src *string, part *int32, off *int64, attempt *int, firstFailure *time.Time) (skip bool) {
	switch k {
	case HeaderRetryDue, HeaderRetryGroup:
		return true
	case HeaderOriginalTopic:
		if p.retry {
			*src = v
			return true
		}
	case HeaderOriginalPartition:
		if p.retry {
			if n, ok := parseCount(v); ok && n <= math.MaxInt32 {
				*part = int32(n)
			}
			return true
		}
	case HeaderOriginalOffset:
		if p.retry {
			if n, ok := parseCount(v); ok {
				*off = n
			}
			return true
		}
	case ackwise.HeaderAttempt:
		// Only a retry topic's: on the main topic the header is a
		// producer's (a handler that forwarded the headers of a retry it
		// handled, or a forgery), not this chain's.
		if n, ok := parseAttempt(v); ok && p.retry {
			*attempt = n
		}
	case ackwise.HeaderFirstFailure:
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil && p.retry {
			*firstFailure = t
		}
	}
	return false
}

// strChunk is the size of the chunks the strings of messages are carved
// from: one allocation serves about 40 records of a typical size, instead
// of one each. A string kept after its message is recycled keeps its
// chunk alive (at most strChunk bytes), as a kept Payload keeps its fetch.
const strChunk = 2048

// carver carves strings from an append-only chunk (Source.strs). The bytes
// below the chunk's length are never written again, which is what makes
// the unsafe.String over them immutable.
type carver struct{ b []byte }

// room makes sure n more bytes fit, starting a new chunk if not (the rest
// of the old one is left unused).
func (c *carver) room(n int) {
	if cap(c.b)-len(c.b) < n {
		c.b = make([]byte, 0, max(strChunk, n))
	}
}

// carve returns a copy of v as a string.
func (c *carver) carve(v []byte) string {
	if len(v) == 0 {
		return ""
	}
	c.room(len(v))
	start := len(c.b)
	c.b = append(c.b, v...)
	return unsafe.String(&c.b[start], len(v))
}

// Recycle takes back the memory of messages for reuse by later deliveries.
// The engine calls it when it is done with messages (settled or released,
// observed); nothing may use them after. Messages of another source, and a
// second Recycle of the same message, are ignored. The deliveries kept for
// reuse are bounded by the most messages ever in flight at once.
func (s *Source) Recycle(msgs ...*ackwise.Message) {
	s.freeMu.Lock()
	defer s.freeMu.Unlock()
	for _, msg := range msgs {
		if msg == nil {
			continue
		}
		rc, ok := msg.Handle.(*receipt)
		if !ok || rc.d == nil || &rc.d.msg != msg || rc.p == nil || rc.seq == recycled {
			continue
		}
		// message overwrites every field on reuse. The recycled mark makes
		// a settle of the recycled message fail; the other pointers are
		// kept (message writes them only when they change: a write barrier
		// each while the garbage collector marks).
		d := rc.d
		d.rc.seq = recycled
		d.msg.Payload = nil // do not hold a fetch's memory while unused
		s.freed = append(s.freed, d)
	}
}

// Detach copies msg's Payload out of the fetch it points into
// (adapters.Detacher), once per delivery: a message waiting in place then
// keeps only its own bytes alive, not its whole fetch (or decompressed
// record batch). Its key, header values and broker ID are in small shared
// chunks already (see strChunk).
func (s *Source) Detach(msg *ackwise.Message) {
	rc, ok := msg.Handle.(*receipt)
	if !ok || rc.d == nil || &rc.d.msg != msg || rc.seq == recycled || rc.d.detached {
		return
	}
	rc.d.detached = true
	msg.Payload = bytes.Clone(msg.Payload)
}
