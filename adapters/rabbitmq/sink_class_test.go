package rabbitmq

import (
	"errors"
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
