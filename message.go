package ackwise

import "time"

// Canonical header names. Producers set HeaderEventID; the engine and the
// adapters read and write the rest. See docs/headers.md.
const (
	// HeaderEventID carries the producer's stable event ID. It stays the same
	// across retries, retry topics, dead-lettering and redrive, and is the key
	// of the idempotency inbox.
	HeaderEventID = "ackwise-event-id"
	// HeaderEventVersion is the schema version of the event, set by producers.
	HeaderEventVersion = "ackwise-event-version"
	// HeaderAggregateVersion is the version of the aggregate the event
	// describes, used by the version gate.
	HeaderAggregateVersion = "ackwise-aggregate-version"
	// HeaderAttempt is the 1-based attempt number on hops the engine owns
	// (retry topics, wait queues). Only the adapters' own moves set it:
	// sinks drop it from what they publish, and the Kafka source reads it
	// only on retry topics, so a handler that forwards the headers of a
	// retry does not make the new message start at that retry's attempt.
	HeaderAttempt = "ackwise-attempt"
	// HeaderFirstFailure is the RFC 3339 time of the first failed attempt, on
	// hops the engine owns. Sinks drop it, as they drop HeaderAttempt.
	HeaderFirstFailure = "ackwise-first-failure"
	// HeaderKey carries Message.Key on brokers whose messages have no key of
	// their own (AMQP, SQS).
	HeaderKey = "ackwise-key"
	// HeaderTraceparent is the W3C trace context header.
	HeaderTraceparent = "traceparent"
)

// MaxAttempt bounds the attempt number an adapter takes from a header or a
// broker's count (HeaderAttempt, x-death, x-delivery-count): no retry
// policy gets that far, so a larger count is a producer's forgery, and sums
// of counts saturate here rather than wrap around to a small number that
// would start the retries over (docs/trust-boundary.md).
const MaxAttempt = 1 << 20

// IsHopHeader reports whether key is one of the headers the engine's own
// hops carry (HeaderAttempt, HeaderFirstFailure): sinks and redrive drop
// them, so that a message published anew starts at attempt 1.
func IsHopHeader(key string) bool {
	return key == HeaderAttempt || key == HeaderFirstFailure
}

// Header is one message header.
type Header struct {
	Key   string
	Value string
}

// Headers are a message's string headers (Kafka record headers, AMQP header
// table entries, SQS message attributes, Pub/Sub attributes), in the order
// the broker gave them. Keys are case-sensitive. A key appears once except
// on a Kafka record that carries it more than once: Get returns the last
// value, as Kafka clients do, and adapters pass every one on.
//
// Headers is a slice so that adapters can hand them over without building a
// map per message (see docs/headers.md). Small header sets are searched
// linearly, which is faster than hashing for the handful of headers messages
// carry. Set, Add and Del change the slice in place; a handler that changes
// the headers of a message it does not own (to publish a copy) clones them
// first.
type Headers []Header

// HeadersOf returns headers from key, value pairs:
// HeadersOf("k1", "v1", "k2", "v2"). It panics on an odd number of
// arguments, which is a programming error.
func HeadersOf(kv ...string) Headers {
	if len(kv)%2 != 0 {
		panic("ackwise: HeadersOf: odd number of arguments")
	}
	h := make(Headers, 0, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// Get returns the value of the last header named key, or "" if there is
// none.
func (h Headers) Get(key string) string {
	v, _ := h.Lookup(key)
	return v
}

// Lookup returns the value of the last header named key and whether there
// is one.
func (h Headers) Lookup(key string) (string, bool) {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Key == key {
			return h[i].Value, true
		}
	}
	return "", false
}

// Has reports whether a header named key is present.
func (h Headers) Has(key string) bool {
	_, ok := h.Lookup(key)
	return ok
}

// Set makes value the only value of key: it replaces the first header named
// key, removes any later ones, or appends the header if there is none.
func (h *Headers) Set(key, value string) {
	s := *h
	for i := range s {
		if s[i].Key == key {
			s[i].Value = value
			*h = append(s[:i+1], deleteKey(s[i+1:], key)...)
			return
		}
	}
	*h = append(s, Header{Key: key, Value: value})
}

// Add appends a header, keeping any others with the same key (Kafka allows
// repeated keys; other brokers keep the last).
func (h *Headers) Add(key, value string) {
	*h = append(*h, Header{Key: key, Value: value})
}

// Del removes every header named key.
func (h *Headers) Del(key string) {
	*h = deleteKey(*h, key)
}

// deleteKey removes the headers named key from s in place.
func deleteKey(s Headers, key string) Headers {
	out := s[:0]
	for _, kv := range s {
		if kv.Key != key {
			out = append(out, kv)
		}
	}
	clear(s[len(out):])
	return out
}

// Clone returns a copy of h that can be changed without changing h.
func (h Headers) Clone() Headers {
	if h == nil {
		return nil
	}
	return append(make(Headers, 0, len(h)+2), h...)
}

// Keys returns the header keys in order. With Get and Set it makes
// *Headers an OpenTelemetry propagation.TextMapCarrier.
func (h Headers) Keys() []string {
	keys := make([]string, len(h))
	for i, kv := range h {
		keys[i] = kv.Key
	}
	return keys
}

// Map returns the headers as a map; of repeated keys the last value wins.
func (h Headers) Map() map[string]string {
	m := make(map[string]string, len(h))
	for _, kv := range h {
		m[kv.Key] = kv.Value
	}
	return m
}

// Message is one delivery of an event.
//
// Producers fill ID, Key, Payload and Headers. An adapter fills the delivery
// facts on receive; they describe this delivery, not the event. A handler
// treats a delivered message as read-only, the payload's bytes and the
// headers included: a retry or a dead letter carries what the message holds
// when it is settled (a dead letter keeps the payload byte for byte only if
// the handler did), and the in-memory broker redelivers it. Decode into
// values of your own. A Message is owned by the engine while its handler
// runs; a handler must not keep it, its Headers or its Payload after
// returning: a source may reuse the Message for a later delivery (see
// adapters.Recycler). Copy what must outlive the call (Headers.Clone,
// bytes.Clone). Its strings (ID, Key, header values) stay valid after the
// call, but an adapter may carve them from memory shared with other
// messages: strings.Clone one kept for long.
type Message struct {
	// ID is the producer's stable event ID (header ackwise-event-id). It is the
	// same on every redelivery of the event.
	ID string
	// Key orders and partitions messages: with key ordering, messages with the
	// same key are handled one at a time in arrival order.
	Key string
	// Payload is the message body. Adapters never change it.
	Payload []byte
	// Headers are the message's headers, the canonical ones included.
	Headers Headers

	// Source is the topic, queue or subscription the message came from.
	Source string
	// Partition is the log partition, or -1 where the broker has none.
	Partition int32
	// Offset is the position in the log partition, or -1 where the broker has
	// none.
	Offset int64
	// BrokerID is the broker's own message ID (SQS MessageId, Pub/Sub message
	// ID, AMQP message-id, "topic/partition@offset" on Kafka).
	BrokerID string
	// Attempt is the 1-based number of this delivery attempt, unified across
	// brokers: 1 for the first delivery.
	Attempt int
	// PublishedAt is when the broker accepted the message, if it says.
	PublishedAt time.Time
	// FirstFailure is when an earlier attempt first failed, where the adapter
	// knows it (zero on a first attempt).
	FirstFailure time.Time

	// Handle is the adapter's receipt for this delivery (a delivery tag, a
	// receipt handle, a partition offset). It is opaque to everything but the
	// adapter that set it. The one exception: on the copy dlq.Redrive
	// publishes of a dead letter it is a dlq.RedriveHandle, which a sink of
	// the dead letter's own broker may read (never settle) to keep what a
	// Message cannot hold; other sinks ignore it.
	Handle any
}

// EventID returns the message's event ID: m.ID, or else the value of its
// last ackwise-event-id header (HeaderEventID; the last, as [Headers.Get]
// reads a Kafka record that repeats the key), or "" when it has neither.
// The ID is taken as is, never trimmed or checked: a producer's ID is
// compared byte for byte by the inbox, redrive and the CLI, which all read
// it through this method. It is the one place the rule lives.
func (m *Message) EventID() string {
	if m.ID != "" {
		return m.ID
	}
	return m.Headers.Get(HeaderEventID)
}
