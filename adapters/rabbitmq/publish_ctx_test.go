package rabbitmq

import (
	"context"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// When ctx ends while a batch waits for its confirms, publish reports the
// messages already confirmed as confirmed and only the others with ctx's
// error (adapters.Sink: a listed message was not confirmed). Before, every
// message of the batch was listed with ctx's error, and a caller that
// published the listed ones again duplicated the confirmed ones.
func TestPublishCtxEndKeepsConfirmed(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	s := &pubSession{conn: c, ch: ch, pending: map[uint64]*pendingPub{}, pubSem: make(chan struct{}, 1), dead: make(chan struct{})}
	p := &publisher{cur: s, changed: make(chan struct{}), refusing: make(chan struct{})}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 4))
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	// The session's loop, but it applies the first confirm alone, then
	// ends ctx: the second message's confirm never comes in time.
	go func() {
		for cf := range confirms {
			if cf.DeliveryTag == 1 {
				s.onConfirm(cf)
				cancel()
			}
		}
	}()
	out := []outgoing{
		{key: cfg.Queue, pub: amqp.Publishing{MessageId: "a", Body: []byte("a")}},
		{key: cfg.Queue, pub: amqp.Publishing{MessageId: "b", Body: []byte("b")}},
	}
	res := p.publish(ctx, out, nil, nil)
	if res[0] != nil {
		t.Errorf("msgs[0], confirmed before ctx ended: %v, want nil", res[0])
	}
	if !errors.Is(res[1], context.Canceled) {
		t.Errorf("msgs[1], unconfirmed when ctx ended: %v, want ctx's error", res[1])
	}
}
