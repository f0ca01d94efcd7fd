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
	// (retry topics, wait queues).
	HeaderAttempt = "ackwise-attempt"
	// HeaderFirstFailure is the RFC 3339 time of the first failed attempt, on
	// hops the engine owns.
	HeaderFirstFailure = "ackwise-first-failure"
	// HeaderKey carries Message.Key on brokers whose messages have no key of
	// their own (AMQP, SQS).
	HeaderKey = "ackwise-key"
	// HeaderTraceparent is the W3C trace context header.
	HeaderTraceparent = "traceparent"
)

// Headers are a message's string headers (Kafka record headers, AMQP header
// table entries, SQS message attributes, Pub/Sub attributes).
type Headers map[string]string

// Clone returns a copy of h that can be changed without changing h.
func (h Headers) Clone() Headers {
	if h == nil {
		return nil
	}
	c := make(Headers, len(h))
	for k, v := range h {
		c[k] = v
	}
	return c
}

// Message is one delivery of an event.
//
// Producers fill ID, Key, Payload and Headers. An adapter fills the delivery
// facts on receive; they describe this delivery, not the event, and a handler
// treats them as read-only. A Message is owned by the engine while its handler
// runs; a handler must not keep it after returning.
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
	// adapter that set it.
	Handle any
}
