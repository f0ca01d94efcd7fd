package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
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
// in the background, for when access is given back.
type Sink struct {
	exchange, key string
	p             *publisher
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
	return &Sink{exchange: cfg.Exchange, key: cfg.RoutingKey, p: p}, nil
}

// Publish publishes msgs and returns once the broker confirmed all of them.
// Each message goes out with its headers (but x-delivery-count, the count a
// quorum queue keeps per delivery, which a message copied from a delivery
// carries), ackwise-event-id (from Message.ID),
// ackwise-key (from Message.Key), message-id = the event ID (or a unique ID
// when there is none), the current timestamp and delivery mode persistent.
// A message no queue takes (basic.return) fails with an error wrapping
// ErrUnroutable; one the broker refuses with an error wrapping ErrNacked.
// A publish the broker refuses by closing the channel (a missing exchange,
// access refused, a message over the broker's size limit) fails with an
// error marked ackwise.Permanent, which carries the *amqp.Error; the other
// failures are transient.
// On error some messages may have been published.
func (s *Sink) Publish(ctx context.Context, msgs ...*ackwise.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	out := make([]outgoing, len(msgs))
	now := time.Now()
	for i, m := range msgs {
		id := adapters.EventID(m)
		h := toTable(m.Headers, 2)
		// The broker's per-delivery count, copied from a delivery (a
		// redriven dead letter): a quorum queue would add it to the
		// message's attempts (attemptOf) on its first delivery.
		delete(h, headerDeliveryCount)
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
		msgID := id
		if msgID == "" {
			msgID = s.p.nextID()
		}
		out[i] = outgoing{exchange: s.exchange, key: key, pub: amqp.Publishing{
			Headers:      h,
			DeliveryMode: amqp.Persistent,
			MessageId:    msgID,
			Timestamp:    now,
			Body:         m.Payload,
		}}
	}
	if err := s.p.publish(ctx, out, nil, nil); err != nil {
		err = fmt.Errorf("rabbitmq: publish %d message(s) to exchange %q: %w", len(msgs), s.exchange, err)
		if refusedOnChannel(err) {
			return ackwise.Permanent(err)
		}
		return err
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
