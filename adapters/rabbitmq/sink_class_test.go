package rabbitmq

import (
	"errors"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/producer"
)

// A publish the broker refuses on the channel (here: the exchange was
// deleted, 404) fails the same way every time: the error is marked
// ackwise.Permanent, so producer.Publisher stops at once instead of
// retrying to its max attempts.
func TestSinkChannelRefusalIsPermanent(t *testing.T) {
	c := needBroker(t)
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ex := "ackwise-test-gone-" + randSuffix()
	if err := ch.ExchangeDeclare(ex, amqp.ExchangeDirect, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	sink := newSink(t, SinkConfig{URL: testURL(), Exchange: ex, RoutingKey: "k"})
	if err := ch.ExchangeDelete(ex, false, false); err != nil {
		t.Fatal(err)
	}

	err = sink.Publish(ctxT(t), &ackwise.Message{ID: "e1", Payload: []byte("x")})
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		t.Fatalf("Publish to a deleted exchange = %v, want the broker's 404", err)
	}
	if c := ackwise.ClassOf(err); c != ackwise.ClassPermanent {
		t.Fatalf("class %v, want permanent", c)
	}

	p, err := producer.New(sink, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(ctxT(t), &ackwise.Message{ID: "e2"}); err == nil || ackwise.ClassOf(err) != ackwise.ClassPermanent {
		t.Fatalf("producer.Publish = %v, want a permanent failure", err)
	}

	// An unroutable message is not refused on the channel: a queue may be
	// bound meanwhile, so it stays transient.
	if err := ch.ExchangeDeclare(ex, amqp.ExchangeDirect, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	err = sink.Publish(ctxT(t), &ackwise.Message{ID: "e3"})
	if !errors.Is(err, ErrUnroutable) || ackwise.ClassOf(err) != ackwise.ClassTransient {
		t.Fatalf("unroutable publish = %v (class %v), want ErrUnroutable, transient", err, ackwise.ClassOf(err))
	}
}

// Only a refusal retrying cannot cure is permanent: 311 (content too large
// "at the present time", amqp091's Temporary) and 405 (resource locked by
// another client) may pass, and an error the client made up itself (Server
// false) says nothing about what the broker accepts.
func TestRefusedOnChannelTransientCodes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  *amqp.Error
		want bool
	}{
		{&amqp.Error{Code: amqp.NotFound, Server: true, Recover: true}, true},
		{&amqp.Error{Code: amqp.AccessRefused, Server: true, Recover: true}, true},
		{&amqp.Error{Code: amqp.PreconditionFailed, Server: true, Recover: true}, true},
		{&amqp.Error{Code: amqp.ContentTooLarge, Server: true, Recover: true}, false},
		{&amqp.Error{Code: amqp.ResourceLocked, Server: true, Recover: true}, false},
		{&amqp.Error{Code: amqp.InternalError, Server: false, Recover: true}, false},
		{&amqp.Error{Code: amqp.ConnectionForced, Server: true}, false},
	} {
		if got := refusedOnChannel(fmt.Errorf("publish: %w", tc.err)); got != tc.want {
			t.Errorf("refusedOnChannel(%d, server %v) = %v, want %v", tc.err.Code, tc.err.Server, got, tc.want)
		}
	}
}
