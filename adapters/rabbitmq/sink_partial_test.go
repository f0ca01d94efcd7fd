package rabbitmq

import (
	"errors"
	"slices"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// A Publish call whose middle message the broker returns (mandatory, no
// queue bound for its routing key) lists that message alone, with
// ErrUnroutable; the others are confirmed and stored. Before, the call
// failed as a whole and a retry published the others twice.
func TestSinkReportsUnroutableMessage(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	if err := withChannel(c, func(ch *amqp.Channel) error {
		return ch.QueueBind(cfg.Queue, "good-"+cfg.Queue, "amq.direct", false, nil) // amq.direct is shared: a key of its own
	}); err != nil {
		t.Fatal(err)
	}
	// No routing key of its own: each message goes with its Key.
	sink := newSink(t, SinkConfig{URL: cfg.URL, Exchange: "amq.direct", ConnectionName: cfg.ConnectionName})
	err := sink.Publish(ctxT(t), partialBatch("good-"+cfg.Queue, "nowhere-"+cfg.Queue)...)
	requireOnlyMiddleFailed(t, c, cfg.Queue, err, func(f error) bool { return errors.Is(f, ErrUnroutable) })
}

// A Publish call whose middle message the broker refuses by closing the
// channel (a routing key the user's topic permissions forbid: 403) lists
// that message alone, marked permanent; the others, unconfirmed when the
// channel died, are sent again and confirmed.
func TestSinkReportsRefusedMessage(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	sink, goodKey := goodOnlySink(t, c, cfg)
	err := sink.Publish(ctxT(t), partialBatch(goodKey, "bad")...)
	requireOnlyMiddleFailed(t, c, cfg.Queue, err, func(f error) bool {
		var ae *amqp.Error
		return errors.As(f, &ae) && ae.Code == amqp.AccessRefused && ackwise.ClassOf(f) == ackwise.ClassPermanent
	})
}

// partialBatch returns three messages, the middle one with key bad, the
// others with key good.
func partialBatch(good, bad string) []*ackwise.Message {
	id := randSuffix()
	return []*ackwise.Message{
		{ID: id + "-0", Key: good, Payload: []byte("0")},
		{ID: id + "-1", Key: bad, Payload: []byte("1")},
		{ID: id + "-2", Key: good, Payload: []byte("2")},
	}
}

// requireOnlyMiddleFailed checks that err lists msgs[1] of partialBatch
// alone, with an error that is wanted, and that queue holds the other two
// (one of them twice, maybe: a message whose confirm the dying channel took
// with it is sent again).
func requireOnlyMiddleFailed(t *testing.T, c *amqp.Connection, queue string, err error, want func(error) bool) {
	t.Helper()
	pe, ok := errors.AsType[*adapters.PublishError](err)
	if !ok || len(pe.Failed) != 1 || pe.Failed[0].Index != 1 {
		t.Fatalf("Publish = %v, want an adapters.PublishError listing msgs[1] alone", err)
	}
	if f := pe.Failed[0].Err; !want(f) {
		t.Fatalf("msgs[1]: %v (class %v)", f, ackwise.ClassOf(f))
	}
	var got []string
	for _, d := range getAll(t, c, queue) {
		got = append(got, string(d.Body))
	}
	slices.Sort(got)
	got = slices.Compact(got)
	if !slices.Equal(got, []string{"0", "2"}) {
		t.Fatalf("queue holds %v, want the confirmed 0 and 2", got)
	}
}

// A Publish call whose middle message the queue refuses (basic.nack: over
// max-length-bytes with reject-publish) lists that message alone, with
// ErrNacked. RabbitMQ nacks it at once and acks the others later with one
// multiple ack that spans it; amqp091-go's NotifyPublish then hands over an
// ack for the nacked message too, so the sink reads its deferred
// confirmation instead. Before, the call returned nil and the message was
// lost.
func TestSinkReportsNackedMessage(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	const limit = 64 << 10
	rejectOver(t, c, cfg.Queue, limit)
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName})
	for range 5 { // the broker's timing decides whether the ack spans the nack: try a few times
		msgs := partialBatch("k", "k")
		msgs[1].Payload = make([]byte, 2*limit)
		err := sink.Publish(ctxT(t), msgs...)
		pe, ok := errors.AsType[*adapters.PublishError](err)
		if !ok || len(pe.Failed) != 1 || pe.Failed[0].Index != 1 || !errors.Is(pe.Failed[0].Err, ErrNacked) {
			t.Fatalf("Publish = %v, want an adapters.PublishError listing msgs[1] alone, nacked", err)
		}
	}
	var got []string
	for _, d := range getAll(t, c, cfg.Queue) {
		got = append(got, string(d.Body))
	}
	slices.Sort(got)
	if want := []string{"0", "0", "0", "0", "0", "2", "2", "2", "2", "2"}; !slices.Equal(got, want) {
		t.Fatalf("queue holds %v, want %v", got, want)
	}
}
