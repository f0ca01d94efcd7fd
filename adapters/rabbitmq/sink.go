package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

// Sink publishes to one exchange with publisher confirms, the mandatory flag
// and persistent delivery. It implements [adapters.Sink]. Publish may be
// called concurrently; calls share one channel, each call writes its batch
// in one go and awaits the batch's confirms together, so confirms are
// pipelined.
//
// When the connection or channel dies, the sink reconnects in the
// background (with backoff) and Publish sends the messages that were not
// confirmed again on the new channel, until its ctx is done: a message may
// then be stored twice, which consumers absorb by its event ID.
// While the broker refuses the reconnection for good (403: wrong user or
// password; 530: no access to the vhost), Publish fails at once with the
// broker's refusal marked ackwise.Permanent; the sink goes on reconnecting
// in the background, for when access is given back. A connection reset
// mid-handshake (a broker restarting) is no refusal: Publish waits.
type Sink struct {
	exchange, key string
	p             *publisher
	tracer        trace.Tracer // SinkConfig.TracerProvider
}

var _ adapters.Sink = (*Sink)(nil)

// NewSink connects to the broker and returns a sink. It fails, naming the
// field and value, on bad configuration, and when the broker cannot be
// reached.
func NewSink(ctx context.Context, cfg SinkConfig) (*Sink, error) {
	c, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	p, err := newPublisher(ctx, c, "sink")
	if err != nil {
		return nil, err
	}
	return &Sink{exchange: cfg.Exchange, key: cfg.RoutingKey, p: p, tracer: tracerOf(cfg.TracerProvider)}, nil
}

// Publish publishes msgs and returns once the broker confirmed all of them.
// Each message goes out with its headers (but x-delivery-count, the count a
// quorum queue keeps per delivery, x-first-death-* and x-last-death-*,
// RabbitMQ's summary of an x-death history a message copied from a
// delivery does not carry, and the engine's hop headers ackwise-attempt and
// ackwise-first-failure, which would make a consumer of a message that
// forwards the headers of a retry count its attempts from that retry's),
// ackwise-event-id (from Message.ID),
// ackwise-key (from Message.Key), message-id = the event ID (or a unique ID
// when there is none), the current timestamp and delivery mode persistent.
//
// The copy dlq.Redrive publishes of a dead letter a [Source] delivered (a
// plain source on the dead-letter queue: its Handle is a
// dlq.RedriveHandle) keeps what a Message cannot hold: the dead letter's
// content-type, content-encoding, correlation-id, reply-to, type, app-id,
// priority, timestamp and message-id, the wire type of every header
// whose value is unchanged (an int stays an int), and its table and array
// headers (but CC and BCC, which would route the copy on). Headers the copy no
// longer has (the envelope and hop headers Redrive strips, x-death) are
// not taken from the dead letter; nor are expiration (the copy would
// expire) and user-id (the broker refuses another user's). A dead letter
// without an event ID is redriven without one: its message-id is kept, or
// one is made that no Source takes for an event ID.
//
// Headers CC and BCC are sent as RabbitMQ's sender-selected distribution:
// each such header is one more routing key (see the package doc).
//
// Publish reports per message, with an *adapters.PublishError: a message no
// queue takes (basic.return) fails with an error wrapping ErrUnroutable;
// one the broker refuses with an error wrapping ErrNacked. A message the
// broker refuses by closing the channel (a missing exchange, access
// refused, a message over the broker's size limit) is found by sending the
// unconfirmed messages again one by one, and fails with an error marked
// ackwise.Permanent, which carries the *amqp.Error. A message whose
// properties and headers do not fit in one frame of the connection's
// negotiated frame_max fails with ErrHeadersTooLarge, and one amqp091-go
// cannot encode (a message-id or header name over 255 bytes) with the
// reason, both marked ackwise.Permanent and before anything is sent: the
// broker would close the connection on them. The other failures are
// transient. A message still unconfirmed when ctx ends, or the sink is
// closed, is listed with that error and may still be published.
func (s *Sink) Publish(ctx context.Context, msgs ...*ackwise.Message) (err error) {
	if len(msgs) == 0 {
		return nil
	}
	dest := s.exchange
	if dest == "" {
		dest = s.key // the default exchange routes to the queue the key names
	}
	ctx, span := startSpan(ctx, s.tracer, SpanPublish, dest, attribute.Int("messaging.batch.message_count", len(msgs)))
	defer func() { endSpan(span, err) }()
	out := make([]outgoing, len(msgs))
	now := time.Now()
	for i, m := range msgs {
		id := m.EventID()
		pub := amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: id, Timestamp: now, Body: m.Payload}
		var orig amqp.Table
		if d := redrivenDelivery(m); d != nil {
			orig = d.Headers
			pub.ContentType, pub.ContentEncoding = d.ContentType, d.ContentEncoding
			pub.CorrelationId, pub.ReplyTo = d.CorrelationId, d.ReplyTo
			pub.Type, pub.AppId, pub.Priority = d.Type, d.AppId, d.Priority
			if !d.Timestamp.IsZero() {
				pub.Timestamp = d.Timestamp
			}
			switch {
			case d.MessageId != "":
				pub.MessageId = d.MessageId
			case id == "":
				pub.MessageId = s.p.anonID()
			}
		}
		if pub.MessageId == "" {
			pub.MessageId = s.p.nextID()
		}
		h := toTable(m.Headers, orig, 2)
		keepNested(h, orig)
		// The engine's hop headers: copied from a delivery a handler
		// forwards, they would count the new message's attempts from
		// that delivery's. Nack sets them on its own copies.
		maps.DeleteFunc(h, func(k string, _ any) bool { return ackwise.IsHopHeader(k) })
		if id != "" {
			h[ackwise.HeaderEventID] = id
		}
		if m.Key != "" {
			h[HeaderKey] = m.Key
		}
		key := s.key
		if key == "" {
			key = m.Key
		}
		pub.Headers = h
		out[i] = outgoing{exchange: s.exchange, key: key, pub: pub}
	}
	errs := s.p.publish(ctx, out, nil, nil)
	for i, err := range errs {
		if err == nil {
			continue
		}
		err = fmt.Errorf("rabbitmq: publish to exchange %q: %w", s.exchange, err)
		if refusedOnChannel(err) {
			err = ackwise.Permanent(err)
		}
		errs[i] = err
	}
	return adapters.NewPublishError(errs)
}

// keepNested adds to t the table and array headers of orig (the dead
// letter a redriven copy is made of), which a Message cannot hold: the
// source leaves them out of Message.Headers, so Redrive neither saw nor
// stripped them. Not x-death (the dead letter's history, which the copy
// does not carry), nor CC and BCC (they would route the copy to more
// queues), nor credentials or the envelope.
func keepNested(t, orig amqp.Table) {
	for k, v := range orig {
		if _, scalar := scalarString(v); scalar || v == nil {
			continue
		}
		if _, ok := t[k]; ok || k == headerDeath || k == headerCC || k == headerBCC || dlq.IsSecretHeader(k) || strings.HasPrefix(k, dlq.HeaderPrefix) {
			continue
		}
		t[k] = v
	}
}

// redrivenDelivery returns the delivery of the dead letter m is
// dlq.Redrive's copy of, when a Source of this package delivered it, or
// nil. Other messages keep only what Message holds, even one copied from a
// delivery of a Source (its Handle a receipt): a handler that publishes a
// changed copy must not inherit, say, a content-type that no longer fits.
func redrivenDelivery(m *ackwise.Message) *amqp.Delivery {
	rh, ok := m.Handle.(dlq.RedriveHandle)
	if !ok || rh.DeadLetter == nil {
		return nil
	}
	if r, ok := rh.DeadLetter.Handle.(*receipt); ok && r != nil {
		return &r.d
	}
	return nil
}

// refusedOnChannel reports whether err carries a soft (channel-level) AMQP
// error: the broker refused what was published (a missing exchange 404,
// access refused 403, a message over max_message_size 406). Publishing the
// same again fails the same way, unlike a lost connection, a nack (a full
// queue with reject-publish) or an unroutable message, which time may cure.
func refusedOnChannel(err error) bool {
	// Not 311 (content too large "at the present time": amqp091's
	// Temporary) nor 405 (locked by another client): those may pass. Not
	// an error the client made up (Server false).
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Recover && ae.Server && !ae.Temporary() && ae.Code != amqp.ResourceLocked
}

// Close waits (at most 10s) for outstanding confirms and closes the
// connection. Publish calls after Close fail with adapters.ErrClosed.
func (s *Sink) Close() error {
	s.p.close()
	return nil
}
