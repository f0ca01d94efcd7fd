package rabbitmq

import (
	"errors"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// redriveTarget declares a plain queue for redriven messages, deleted when
// the test ends.
// redriveSetup declares a queue with a wait tier of 50ms, opens a source on
// it, and declares a target queue to redrive to (deleted when the test
// ends); it returns the test connection, the config, the source and the
// target's name.
func redriveSetup(t *testing.T) (*amqp.Connection, Config, *Source, string) {
	t.Helper()
	c := needBroker(t)
	cfg := testConfig(t, Classic, 50*time.Millisecond)
	declare(t, cfg)
	target := cfg.Queue + ".target"
	plainQueue(t, c, target)
	return c, cfg, newSource(t, cfg), target
}

// plainQueue declares a durable queue name, deleted when the test ends.
func plainQueue(t *testing.T, c *amqp.Connection, name string) {
	t.Helper()
	if err := withChannel(c, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(name, true, false, false, false, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = withChannel(c, func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(name, false, false, false)
			return err
		})
	})
}

// redriveAll moves every dead letter of cfg's dead-letter queue to target
// with dlq.Redrive, through a plain source and a sink, as the CLI does.
func redriveAll(t *testing.T, cfg Config, target string, want int) {
	t.Helper()
	from := newSource(t, Config{URL: cfg.URL, Queue: cfg.Queue + ".dlq", Plain: true})
	to := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: target})
	res, err := dlq.Redrive(ctxT(t), from, to, dlq.RedriveOptions{Rate: dlq.RateUnlimited, IdleTimeout: 500 * time.Millisecond})
	if err != nil || res.Moved != want {
		t.Fatalf("redrive: %+v, %v; want %d moved", res, err, want)
	}
}

// TestRedriveKeepsPropertiesAndHeaderTypes: a dead letter redriven through
// the sink goes out with the AMQP properties and the header value types of
// the message the producer sent, without the envelope, the hop headers or
// x-death. Before, the sink published only string headers, the event ID and
// the key: content-type, content-encoding, correlation-id, reply-to, type,
// app-id, priority and the producer's timestamp were lost, and an int or
// boolean header came back as a string.
func TestRedriveKeepsPropertiesAndHeaderTypes(t *testing.T) {
	t.Parallel()
	c, cfg, src, target := redriveSetup(t)

	sent := time.Now().Add(-time.Hour).Truncate(time.Second)
	userHeaders := amqp.Table{
		ackwise.HeaderEventID: "ev-1",
		"x-tenant":            "acme",
		"x-int":               int32(42),
		"x-long":              int64(1) << 40,
		"x-bool":              true,
		"x-float":             1.5,
		"x-bytes":             []byte("raw"),
		"x-time":              sent,
		// Tables and arrays: a Message cannot hold them, the copy keeps them.
		"x-nested": amqp.Table{"region": "eu", "shard": int32(3)},
		"x-list":   []any{"a", int32(2)},
	}
	pub := amqp.Publishing{
		Headers:         userHeaders,
		ContentType:     "application/json",
		ContentEncoding: "gzip",
		DeliveryMode:    amqp.Persistent,
		Priority:        7,
		CorrelationId:   "corr-1",
		ReplyTo:         "replies",
		Expiration:      "600000",
		MessageId:       "mid-1",
		Timestamp:       sent,
		Type:            "order.created",
		AppId:           "shop",
		Body:            []byte(`{"order":1}`),
	}
	rawPublish(t, c, cfg.Queue, pub)
	m := receive(t, src)
	if err := src.Nack(ctxT(t), m, 0); err != nil { // x-death and the hop headers
		t.Fatal(err)
	}
	m = receive(t, src)
	env := dlq.New(m, dlq.ReasonPermanent, errors.New("boom"), ackwise.ClassPermanent, time.Now(), "billing", "v1")
	if err := src.DeadLetter(ctxT(t), m, env); err != nil {
		t.Fatal(err)
	}
	redriveAll(t, cfg, target, 1)

	got := getAll(t, c, target)
	if len(got) != 1 {
		t.Fatalf("%d redriven messages, want 1", len(got))
	}
	d := got[0]
	type props struct {
		ContentType, ContentEncoding, CorrelationId, ReplyTo, Type, AppId, MessageId, Expiration string
		Priority, DeliveryMode                                                                   uint8
		Timestamp                                                                                time.Time
	}
	wantProps := props{pub.ContentType, pub.ContentEncoding, pub.CorrelationId, pub.ReplyTo, pub.Type, pub.AppId, pub.MessageId, "", pub.Priority, amqp.Persistent, sent}
	gotProps := props{d.ContentType, d.ContentEncoding, d.CorrelationId, d.ReplyTo, d.Type, d.AppId, d.MessageId, d.Expiration, d.Priority, d.DeliveryMode, d.Timestamp.Truncate(time.Second)}
	if gotProps != wantProps {
		t.Errorf("properties\n got %+v\nwant %+v", gotProps, wantProps)
	}
	if string(d.Body) != string(pub.Body) {
		t.Errorf("body %q", d.Body)
	}
	for k, v := range userHeaders {
		if k == "x-time" {
			// AMQP timestamps have second precision.
			if tv, ok := d.Headers[k].(time.Time); !ok || !tv.Equal(sent) {
				t.Errorf("header %s = %#v, want %v", k, d.Headers[k], sent)
			}
			continue
		}
		if !reflect.DeepEqual(d.Headers[k], v) {
			t.Errorf("header %s = %#v (%T), want %#v (%T)", k, d.Headers[k], d.Headers[k], v, v)
		}
	}
	for k := range d.Headers {
		if k == dlq.HeaderRedriveCount {
			// The one header a redrive adds: its first move.
			if d.Headers[k] != "1" {
				t.Errorf("header %s = %#v, want \"1\"", k, d.Headers[k])
			}
			continue
		}
		if _, ok := userHeaders[k]; !ok {
			t.Errorf("redriven message carries header %s = %#v", k, d.Headers[k])
		}
	}
	if _, ok := d.Headers[dlq.HeaderRedriveCount]; !ok {
		t.Errorf("redriven message carries no %s", dlq.HeaderRedriveCount)
	}
}

// TestRedriveKeepsMissingEventID: a dead letter of a message that had no
// event ID (a foreign producer set neither ackwise-event-id nor message-id)
// is redriven without one, as its handler first saw it. Before, the sink
// gave it a message-id of its own making, which the consumer took for the
// event ID: a new one at every redrive of the same dead letter.
func TestRedriveKeepsMissingEventID(t *testing.T) {
	t.Parallel()
	c, cfg, src, target := redriveSetup(t)
	rawPublish(t, c, cfg.Queue, amqp.Publishing{Body: []byte("no id")})
	m := receive(t, src)
	if m.ID != "" {
		t.Fatalf("first delivery has ID %q, want none", m.ID)
	}
	if err := src.DeadLetter(ctxT(t), m, dlq.New(m, dlq.ReasonPermanent, errors.New("no event ID"), ackwise.ClassPermanent, time.Now(), "billing", "v1")); err != nil {
		t.Fatal(err)
	}
	redriveAll(t, cfg, target, 1)
	read := newSource(t, Config{URL: cfg.URL, Queue: target, Plain: true})
	r := receive(t, read)
	if r.ID != "" || r.Headers.Has(ackwise.HeaderEventID) {
		t.Errorf("redriven message has event ID %q (message-id %q), want none", r.ID, r.BrokerID)
	}
}
