package rabbitmq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

const testTimeout = 20 * time.Second

func newSource(t *testing.T, cfg Config) *Source {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	s, err := NewSource(ctx, cfg)
	if err != nil {
		t.Fatalf("NewSource: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newSink(t *testing.T, cfg SinkConfig) *Sink {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	s, err := NewSink(ctx, cfg)
	if err != nil {
		t.Fatalf("NewSink: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func receive(t *testing.T, src adapters.Source) *ackwise.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	buf := make([]*ackwise.Message, 1)
	n, err := src.Receive(ctx, buf)
	if err != nil || n != 1 {
		t.Fatalf("receive: %d, %v", n, err)
	}
	return buf[0]
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// rawPublish publishes with the plain client, as a foreign producer would.
func rawPublish(t *testing.T, c *amqp.Connection, queue string, p amqp.Publishing) {
	t.Helper()
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, p)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctxT(t)); !ok || err != nil {
		t.Fatalf("raw publish not confirmed: %v %v", ok, err)
	}
}

func queueDepth(t *testing.T, c *amqp.Connection, queue string) int {
	t.Helper()
	var n int
	err := withChannel(c, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	if err != nil {
		t.Fatalf("inspect %s: %v", queue, err)
	}
	return n
}

func TestUnroutablePublishIsAnError(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)

	// The default exchange with a queue that does not exist.
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue + ".nope", ConnectionName: cfg.ConnectionName})
	err := sink.Publish(ctxT(t), &ackwise.Message{ID: "a", Payload: []byte("x")})
	if !errors.Is(err, ErrUnroutable) {
		t.Fatalf("publish to a missing queue: %v, want ErrUnroutable", err)
	}

	// A missing exchange closes the channel (404): an error, not a retry
	// loop, and the sink recovers.
	sink = newSink(t, SinkConfig{URL: cfg.URL, Exchange: cfg.Queue + ".no-exchange", ConnectionName: cfg.ConnectionName})
	err = sink.Publish(ctxT(t), &ackwise.Message{ID: "a", Payload: []byte("x")})
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		t.Fatalf("publish to a missing exchange: %v, want a 404 channel error", err)
	}

	// A batch where only the middle message has no route: the batch fails,
	// the others are delivered, and the sink stays usable.
	sink = newSink(t, SinkConfig{URL: cfg.URL, Exchange: "amq.direct", ConnectionName: cfg.ConnectionName})
	err = withChannel(c, func(ch *amqp.Channel) error {
		return ch.QueueBind(cfg.Queue, "good-"+cfg.Queue, "amq.direct", false, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	err = sink.Publish(ctxT(t),
		&ackwise.Message{ID: "1", Key: "good-" + cfg.Queue, Payload: []byte("1")},
		&ackwise.Message{ID: "2", Key: "bad-" + cfg.Queue, Payload: []byte("2")},
		&ackwise.Message{ID: "3", Key: "good-" + cfg.Queue, Payload: []byte("3")},
	)
	if !errors.Is(err, ErrUnroutable) || !strings.Contains(err.Error(), "bad-"+cfg.Queue) {
		t.Fatalf("batch with one unroutable message: %v", err)
	}
	if strings.Contains(err.Error(), "good-") {
		t.Fatalf("routable messages reported as unroutable: %v", err)
	}
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "4", Key: "good-" + cfg.Queue, Payload: []byte("4")}); err != nil {
		t.Fatalf("publish after a return: %v", err)
	}
	if n := queueDepth(t, c, cfg.Queue); n != 3 {
		t.Fatalf("queue holds %d messages, want 3", n)
	}
}

func TestNackToMissingWaitQueueKeepsOriginal(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic, 50*time.Millisecond)
	declare(t, cfg)
	src := newSource(t, cfg)
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName})
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "e1", Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	m := receive(t, src)
	// Someone deletes the wait queue under a running consumer.
	if err := withChannel(c, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(WaitQueueName(cfg.Queue, 50*time.Millisecond), false, false, false)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	err := src.Nack(ctxT(t), m, 0)
	if !errors.Is(err, ErrUnroutable) {
		t.Fatalf("nack to a missing wait queue: %v, want ErrUnroutable", err)
	}
	// The original was not acked: it is still ours to settle.
	if !src.Valid(m) {
		t.Fatal("message invalid after a failed move")
	}
	if err := src.Release(ctxT(t), m); err != nil {
		t.Fatal(err)
	}
	again := receive(t, src)
	if again.ID != "e1" {
		t.Fatalf("got %q after release, want e1", again.ID)
	}
	if err := src.Ack(ctxT(t), again); err != nil {
		t.Fatal(err)
	}
}

func TestDeadLetterKeepsPayloadHeadersAndXDeath(t *testing.T) {
	t.Parallel()
	for _, qt := range []QueueType{Classic, Quorum} {
		t.Run(string(qt), func(t *testing.T) {
			t.Parallel()
			c := needBroker(t)
			cfg := testConfig(t, qt, 50*time.Millisecond)
			declare(t, cfg)
			src := newSource(t, cfg)
			payload := make([]byte, 0, 512+256)
			for i := range 512 {
				payload = append(payload, byte(i))
			}
			payload = append(payload, bytes.Repeat([]byte{0xff, 0x00}, 128)...)
			rawPublish(t, c, cfg.Queue, amqp.Publishing{
				Headers:      amqp.Table{ackwise.HeaderEventID: "ev-1", "x-tenant": "acme", "x-int": int32(42)},
				ContentType:  "application/octet-stream",
				DeliveryMode: amqp.Persistent,
				MessageId:    "mid-1",
				Expiration:   "600000", // must not travel to the wait queue
				Body:         payload,
			})
			m := receive(t, src)
			if m.Attempt != 1 || m.ID != "ev-1" || m.BrokerID != "mid-1" {
				t.Fatalf("first delivery: attempt %d id %q broker id %q", m.Attempt, m.ID, m.BrokerID)
			}
			if err := src.Nack(ctxT(t), m, 0); err != nil {
				t.Fatalf("nack: %v", err)
			}
			m = receive(t, src)
			if m.Attempt != 2 || m.FirstFailure.IsZero() {
				t.Fatalf("after the wait queue: attempt %d first failure %v", m.Attempt, m.FirstFailure)
			}
			now := time.Now()
			env := dlq.New(m, dlq.ReasonMaxAttempts, errors.New("boom"), ackwise.ClassTransient, now, "billing", "v1")
			if err := src.DeadLetter(ctxT(t), m, env); err != nil {
				t.Fatalf("dead-letter: %v", err)
			}
			got := getAll(t, c, cfg.Queue+".dlq")
			if len(got) != 1 {
				t.Fatalf("%d dead letters, want 1", len(got))
			}
			d := got[0]
			if !bytes.Equal(d.Body, payload) {
				t.Fatalf("payload differs: %d bytes, want %d", len(d.Body), len(payload))
			}
			if d.Headers["x-tenant"] != "acme" || d.Headers[ackwise.HeaderEventID] != "ev-1" || d.ContentType != "application/octet-stream" || d.MessageId != "mid-1" {
				t.Fatalf("headers or properties lost: %v %q %q", d.Headers, d.ContentType, d.MessageId)
			}
			if v, ok := d.Headers["x-int"].(int32); !ok || v != 42 {
				t.Fatalf("x-int = %#v, want int32 42 (wire type kept)", d.Headers["x-int"])
			}
			if d.Expiration != "" {
				t.Fatalf("expiration %q carried to the dead letter", d.Expiration)
			}
			deaths, ok := d.Headers["x-death"].([]any)
			if !ok || len(deaths) == 0 {
				t.Fatalf("x-death lost: %#v", d.Headers["x-death"])
			}
			if q := deaths[0].(amqp.Table)["queue"]; q != WaitQueueName(cfg.Queue, 50*time.Millisecond) {
				t.Fatalf("x-death queue %v", q)
			}
			e, err := dlq.Decode(fromTable(d.Headers))
			if err != nil {
				t.Fatal(err)
			}
			if e.Reason != dlq.ReasonMaxAttempts || e.Attempts != 2 || e.Source != cfg.Queue || e.MessageID != "mid-1" || e.Consumer != "billing" {
				t.Fatalf("envelope %+v", e)
			}
			if _, ok := d.Headers[headerDeliveryCount]; ok && qt == Classic {
				t.Fatalf("x-delivery-count copied into the dead letter")
			}
			if n := queueDepth(t, c, cfg.Queue); n != 0 {
				t.Fatalf("work queue holds %d, want 0 after the dead letter was acked", n)
			}
		})
	}
}

func TestTopologyVerifiedBeforeConsuming(t *testing.T) {
	t.Parallel()
	c := needBroker(t)

	cfg := testConfig(t, Classic, time.Second)
	_, err := NewSource(ctxT(t), cfg)
	if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), cfg.Queue) {
		t.Fatalf("no topology: %v", err)
	}

	// A wait queue someone declared without its dead-letter target would
	// drop retries: refuse to start.
	cfg = testConfig(t, Classic, time.Second)
	declare(t, cfg)
	wait := WaitQueueName(cfg.Queue, time.Second)
	if err := withChannel(c, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDelete(wait, false, false, false); err != nil {
			return err
		}
		_, err := ch.QueueDeclare(wait, true, false, false, false, amqp.Table{argMessageTTL: int64(1000)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_, err = NewSource(ctxT(t), cfg)
	if err == nil || !strings.Contains(err.Error(), "other arguments") || !strings.Contains(err.Error(), wait) {
		t.Fatalf("wait queue without dead-letter exchange: %v", err)
	}
	cfg.DeclareTopology = true
	if _, err = NewSource(ctxT(t), cfg); err == nil || !strings.Contains(err.Error(), "other arguments") {
		t.Fatalf("declare over a mismatching queue: %v", err)
	}

	// Quorum config over classic queues.
	cfg = testConfig(t, Classic, time.Second)
	declare(t, cfg)
	cfg.QueueType = Quorum
	if _, err = NewSource(ctxT(t), cfg); err == nil || !strings.Contains(err.Error(), "x-queue-type") {
		t.Fatalf("quorum config on classic queues: %v", err)
	}
}

func TestDeclareSetsQueueArguments(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Quorum, 30*time.Second)
	declare(t, cfg)
	// Declaring again with exactly the documented arguments succeeds only if
	// the queue has them.
	wait := WaitQueueName(cfg.Queue, 30*time.Second)
	args := amqp.Table{argQueueType: "quorum", argMessageTTL: int64(30000), argDLX: "", argDLRoutingKey: cfg.Queue, argDLStrategy: "at-least-once", argOverflow: "reject-publish"}
	if err := withChannel(c, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(wait, true, false, false, false, args)
		return err
	}); err != nil {
		t.Fatalf("wait queue %s lacks the documented arguments: %v", wait, err)
	}
}

func TestAttemptCounting(t *testing.T) {
	t.Parallel()
	// Quorum queues count every delivery (x-delivery-count); classic queues
	// only flag a redelivery, so repeated releases count once.
	for qt, want := range map[QueueType][]int{Quorum: {1, 2, 3}, Classic: {1, 2, 2}} {
		t.Run(string(qt), func(t *testing.T) {
			t.Parallel()
			needBroker(t)
			cfg := testConfig(t, qt)
			declare(t, cfg)
			src := newSource(t, cfg)
			if got := src.Capabilities().DeliveryCount; got != (qt == Quorum) {
				t.Fatalf("DeliveryCount = %v", got)
			}
			sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName})
			if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "e", Payload: []byte("p")}); err != nil {
				t.Fatal(err)
			}
			for i, w := range want {
				m := receive(t, src)
				if m.Attempt != w {
					t.Fatalf("delivery %d: attempt %d, want %d", i+1, m.Attempt, w)
				}
				if i == len(want)-1 {
					if err := src.Ack(ctxT(t), m); err != nil {
						t.Fatal(err)
					}
					break
				}
				if err := src.Release(ctxT(t), m); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestReceiptVoidAfterServerSideClose(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic, time.Second)
	declare(t, cfg)
	src := newSource(t, cfg)
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName + "-sink"})
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "e", Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	m := receive(t, src)
	if !src.Valid(m) {
		t.Fatal("fresh delivery not valid")
	}
	if n := closeConnections(t, cfg.ConnectionName); n < 2 {
		t.Fatalf("closed %d connections, want the consumer's and the publisher's", n)
	}
	// The channel's death reaches the client asynchronously; no event to
	// await from outside the source.
	deadline := time.Now().Add(testTimeout)
	for src.Valid(m) {
		if time.Now().After(deadline) {
			t.Fatal("delivery still valid after its connection was closed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for name, settle := range map[string]func() error{
		"ack":         func() error { return src.Ack(ctxT(t), m) },
		"nack":        func() error { return src.Nack(ctxT(t), m, time.Second) },
		"dead-letter": func() error { return src.DeadLetter(ctxT(t), m, dlq.Envelope{Reason: dlq.ReasonPermanent}) },
		"release":     func() error { return src.Release(ctxT(t), m) },
	} {
		if err := settle(); !errors.Is(err, adapters.ErrReceiptInvalid) {
			t.Errorf("%s on a dead channel: %v, want ErrReceiptInvalid", name, err)
		}
	}
	// The broker redelivers on the new channel; the source recovered by
	// itself.
	again := receive(t, src)
	if again.ID != "e" || again.Attempt != 2 {
		t.Fatalf("redelivery %q attempt %d, want e attempt 2", again.ID, again.Attempt)
	}
	if err := src.Ack(ctxT(t), again); err != nil {
		t.Fatalf("ack on the new channel: %v", err)
	}
	if n := len(getAll(t, c, cfg.Queue+".dlq")) + len(getAll(t, c, WaitQueueName(cfg.Queue, time.Second))); n != 0 {
		t.Fatalf("a settle on the dead channel moved the message (%d copies)", n)
	}
	// The sink recovered too.
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "f", Payload: []byte("q")}); err != nil {
		t.Fatalf("publish after the close: %v", err)
	}
	if m := receive(t, src); m.ID != "f" {
		t.Fatalf("got %q, want f", m.ID)
	}
}

func TestReceiveBatchesAndClose(t *testing.T) {
	t.Parallel()
	needBroker(t)
	cfg := testConfig(t, Classic)
	cfg.Prefetch = 10
	declare(t, cfg)
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName})
	msgs := make([]*ackwise.Message, 25)
	for i := range msgs {
		msgs[i] = &ackwise.Message{ID: strconv.Itoa(i), Payload: []byte{byte(i)}}
	}
	if err := sink.Publish(ctxT(t), msgs...); err != nil {
		t.Fatal(err)
	}
	src := newSource(t, cfg)
	buf := make([]*ackwise.Message, 64)
	var got []*ackwise.Message
	for len(got) < 10 {
		n, err := src.Receive(ctxT(t), buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	// Prefetch bounds what the broker hands over unacknowledged.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	n, err := src.Receive(ctx, buf)
	cancel()
	if n != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("received %d (%v) beyond prefetch 10", n, err)
	}
	for _, m := range got {
		if err := src.Ack(ctxT(t), m); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() {
		for {
			_, err := src.Receive(context.Background(), buf)
			if err != nil {
				done <- err
				return
			}
		}
	}()
	src.Close()
	select {
	case err := <-done:
		if !errors.Is(err, adapters.ErrClosed) {
			t.Fatalf("Receive after Close: %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Receive still blocked after Close")
	}
}

// countingMeter counts Add calls on every Int64Counter it creates.
type countingMeter struct {
	noop.MeterProvider
	n *atomic.Int64
}

func (m countingMeter) Meter(string, ...metric.MeterOption) metric.Meter {
	return countingMeterImpl{n: m.n}
}

type countingMeterImpl struct {
	noop.Meter
	n *atomic.Int64
}

func (m countingMeterImpl) Int64Counter(string, ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return countingCounter{n: m.n}, nil
}

type countingCounter struct {
	noop.Int64Counter
	n *atomic.Int64
}

func (c countingCounter) Add(_ context.Context, v int64, _ ...metric.AddOption) { c.n.Add(v) }

// recordHandler hands every log record to a channel.
type recordHandler struct {
	ch chan slog.Record
}

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	select {
	case h.ch <- r:
	default:
	}
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }

func TestConsumerTimeoutWarning(t *testing.T) {
	t.Parallel()
	needBroker(t)
	cfg := testConfig(t, Classic)
	cfg.ConsumerTimeout = time.Minute
	cfg.ConsumerTimeoutWarn = 150 * time.Millisecond
	logs := make(chan slog.Record, 16)
	cfg.Logger = slog.New(recordHandler{ch: logs})
	var warned atomic.Int64
	cfg.MeterProvider = countingMeter{n: &warned}
	declare(t, cfg)
	src := newSource(t, cfg)
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName})
	// The warning counts from the delivery's arrival at the client, which
	// is before Receive returns it but not before the publish.
	start := time.Now()
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "slow", Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	m := receive(t, src)
	timeout := time.After(testTimeout)
	for {
		select {
		case r := <-logs:
			if !strings.Contains(r.Message, "consumer_timeout") {
				continue
			}
			if held := time.Since(start); held < cfg.ConsumerTimeoutWarn {
				t.Fatalf("warned after %v, before ConsumerTimeoutWarn", held)
			}
			if warned.Load() != 1 {
				t.Fatalf("metric counted %d warnings, want 1", warned.Load())
			}
			if err := src.Ack(ctxT(t), m); err != nil {
				t.Fatal(err)
			}
			return
		case <-timeout:
			t.Fatal("no consumer-timeout warning")
		}
	}
}

// TestRecoveryUnderLoad closes every connection of a publisher and a
// consumer from the server side, twice, while 10,000 messages flow: nothing
// is lost and both recover on their own.
func TestRecoveryUnderLoad(t *testing.T) {
	t.Parallel()
	for _, qt := range []QueueType{Classic, Quorum} {
		t.Run(string(qt), func(t *testing.T) {
			t.Parallel()
			testRecoveryUnderLoad(t, qt)
		})
	}
}

func testRecoveryUnderLoad(t *testing.T, qt QueueType) {
	const total, batch, window = 10000, 100, 3000
	needBroker(t)
	cfg := testConfig(t, qt)
	declare(t, cfg)
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName + "-sink"})
	src := newSource(t, cfg)

	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	seen := make(map[string]int, total)
	progress := make(chan struct{}, 1)
	// While the test closes connections it holds hold: handlers then keep
	// their deliveries in flight, so that the close voids them.
	var hold sync.RWMutex
	h := ackwise.HandlerFunc(func(_ context.Context, m *ackwise.Message) error {
		hold.RLock()
		hold.RUnlock()
		mu.Lock()
		seen[m.ID]++
		cond.Broadcast()
		mu.Unlock()
		select {
		case progress <- struct{}{}:
		default:
		}
		return nil
	})
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	cons, err := consumer.New(src, h, consumer.Config{Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- cons.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("consumer: %v", err)
		}
	}()

	// The publisher stays at most window messages ahead of the consumer, so
	// it is still publishing when the connections close.
	var published atomic.Int64
	pubErr := make(chan error, 1)
	go func() {
		pctx, pcancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer pcancel()
		for i := 0; i < total; i += batch {
			mu.Lock()
			for len(seen) < i-window {
				cond.Wait()
			}
			mu.Unlock()
			msgs := make([]*ackwise.Message, batch)
			for j := range msgs {
				msgs[j] = &ackwise.Message{ID: fmt.Sprintf("m-%05d", i+j), Payload: []byte(strconv.Itoa(i + j))}
			}
			if err := sink.Publish(pctx, msgs...); err != nil {
				pubErr <- fmt.Errorf("publish batch at %d: %w", i, err)
				return
			}
			published.Add(batch)
		}
		pubErr <- nil
	}()

	deadline := time.After(90 * time.Second)
	allPublished := false
	// The source's reconnection has no event to await from outside; the
	// ticker re-checks it.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	waitUntil := func(what string, cond func() bool) {
		for !cond() {
			select {
			case <-tick.C:
			case <-progress:
			case err := <-pubErr:
				if err != nil {
					t.Fatal(err)
				}
				allPublished = true
			case <-deadline:
				t.Fatalf("waiting for %s: received %d of %d distinct messages (published all: %v)", what, count(), total, allPublished)
			}
		}
	}
	generation := func() uint64 {
		src.mu.Lock()
		defer src.mu.Unlock()
		return src.gen
	}
	for round := 1; round <= 2; round++ {
		before := count()
		waitUntil("more messages", func() bool { return count() >= before+1000 })
		hold.Lock()
		n, p := count(), published.Load()
		got := closeConnections(t, cfg.ConnectionName)
		hold.Unlock()
		t.Logf("round %d: closed %d connections with %d received, %d published", round, got, n, p)
		if got < 3 {
			t.Errorf("closed %d connections, want sink, consumer and mover", got)
		}
		if p >= total {
			t.Fatalf("round %d: publishing ended before the connections were closed", round)
		}
		waitUntil("the consumer to reconnect", func() bool { return generation() > uint64(round) })
	}
	waitUntil("all messages", func() bool { return allPublished && count() == total })
	mu.Lock()
	dups := 0
	for _, k := range seen {
		dups += k - 1
	}
	mu.Unlock()
	t.Logf("all %d received; %d redelivered duplicates; consumer generation %d", total, dups, generation())
}

// TestShortDelayNotBlockedByLongDelay: each tier has its own wait queue, so
// a short delay is not held back behind a long one (per-message expiration
// in one queue would block at its head).
func TestShortDelayNotBlockedByLongDelay(t *testing.T) {
	t.Parallel()
	needBroker(t)
	cfg := testConfig(t, Classic, 100*time.Millisecond, time.Minute)
	declare(t, cfg)
	src := newSource(t, cfg)
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName})
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "long", Payload: []byte("1")}, &ackwise.Message{ID: "short", Payload: []byte("2")}); err != nil {
		t.Fatal(err)
	}
	byID := map[string]*ackwise.Message{}
	for len(byID) < 2 {
		m := receive(t, src)
		byID[m.ID] = m
	}
	if err := src.Nack(ctxT(t), byID["long"], 30*time.Second); err != nil { // rounds up to the 1m tier
		t.Fatal(err)
	}
	if err := src.Nack(ctxT(t), byID["short"], 50*time.Millisecond); err != nil { // rounds up to 100ms
		t.Fatal(err)
	}
	m := receive(t, src)
	if m.ID != "short" || m.Attempt != 2 {
		t.Fatalf("got %q attempt %d, want short attempt 2", m.ID, m.Attempt)
	}
	if err := src.Ack(ctxT(t), m); err != nil {
		t.Fatal(err)
	}
	c := needBroker(t)
	if n := queueDepth(t, c, WaitQueueName(cfg.Queue, time.Minute)); n != 1 {
		t.Fatalf("1m wait queue holds %d, want the long one", n)
	}
}

// TestCoalescedAcksNeverAckUnsettled: acks are coalesced into multiple=true
// acks, which must never cover a delivery still in a handler or one that
// was released.
func TestCoalescedAcksNeverAckUnsettled(t *testing.T) {
	t.Parallel()
	for _, qt := range []QueueType{Classic, Quorum} {
		t.Run(string(qt), func(t *testing.T) {
			t.Parallel()
			needBroker(t)
			cfg := testConfig(t, qt)
			cfg.Prefetch = 50
			declare(t, cfg)
			sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName})
			msgs := make([]*ackwise.Message, 10)
			for i := range msgs {
				msgs[i] = &ackwise.Message{ID: strconv.Itoa(i), Payload: []byte{byte(i)}}
			}
			if err := sink.Publish(ctxT(t), msgs...); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			src, err := NewSource(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			byID := map[string]*ackwise.Message{}
			buf := make([]*ackwise.Message, 10)
			for len(byID) < 10 {
				n, err := src.Receive(ctx, buf)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range buf[:n] {
					byID[m.ID] = m
				}
			}
			flush := func() { byID["0"].Handle.(*receipt).s.flush() }
			for _, id := range []string{"0", "1", "2", "4", "5", "6"} { // 3 is still "in a handler"
				if err := src.Ack(ctx, byID[id]); err != nil {
					t.Fatal(err)
				}
			}
			flush()
			if err := src.Release(ctx, byID["7"]); err != nil {
				t.Fatal(err)
			}
			if err := src.Ack(ctx, byID["8"]); err != nil {
				t.Fatal(err)
			}
			flush()
			// 3 and 9 unsettled, 7 released: the broker must hand exactly
			// those out again once this consumer is gone.
			src.Close()
			again := newSource(t, cfg)
			got := map[string]bool{}
			for len(got) < 3 {
				m := receive(t, again)
				got[m.ID] = true
			}
			short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancelShort()
			if n, _ := again.Receive(short, buf); n > 0 {
				got[buf[0].ID] = true
			}
			if len(got) != 3 || !got["3"] || !got["7"] || !got["9"] {
				t.Fatalf("redelivered %v, want exactly 3, 7 and 9", got)
			}
		})
	}
}

// TestOpenByURL opens a sink and a source through adapters.OpenSink and
// OpenSource, the way applications configure brokers.
func TestOpenByURL(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Quorum, 200*time.Millisecond)
	q := url.Values{"queue_type": {"quorum"}, "tiers": {"200ms"}, "declare": {"true"}, "connection_name": {cfg.ConnectionName}}
	rawURL := func(q url.Values) string { return sourceURL(t, cfg.Queue, q) }
	sink, err := adapters.OpenSink(ctxT(t), rawURL(q))
	if err != nil {
		t.Fatalf("OpenSink: %v", err)
	}
	defer sink.Close()
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "u1", Key: "k", Payload: []byte("by url")}); err != nil {
		t.Fatal(err)
	}
	q.Set("prefetch", "16") // for sources only
	src, err := adapters.OpenSource(ctxT(t), rawURL(q))
	if err != nil {
		t.Fatalf("OpenSource: %v", err)
	}
	defer src.Close()
	if caps := src.Capabilities(); !caps.DeliveryCount || len(caps.DelayTiers) != 1 || caps.DelayTiers[0] != 200*time.Millisecond {
		t.Fatalf("capabilities %+v", caps)
	}
	m := receive(t, src)
	if m.ID != "u1" || m.Key != "k" || string(m.Payload) != "by url" || m.Source != cfg.Queue {
		t.Fatalf("got %+v", m)
	}
	if err := src.Ack(ctxT(t), m); err != nil {
		t.Fatal(err)
	}
	// declare=true made the whole topology.
	for _, q := range []string{cfg.Queue + ".dlq", WaitQueueName(cfg.Queue, 200*time.Millisecond)} {
		queueDepth(t, c, q)
	}
}

// TestMovesDropSenderSelectedDistribution: a delivery published with a CC
// header (RabbitMQ's sender-selected distribution) keeps it; a move that
// copied it would route the copy to every queue it names as well, so that a
// retry came back at once and a dead letter went back to work. RabbitMQ's
// own dead-lettering removes CC and BCC for the same reason.
func TestMovesDropSenderSelectedDistribution(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic, time.Minute)
	declare(t, cfg)
	audit := cfg.Queue + ".audit"
	if err := withChannel(c, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(audit, false, true, false, false, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = withChannel(c, func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(audit, false, false, false)
			return err
		})
	})
	src := newSource(t, cfg)
	for _, id := range []string{"retry", "dead"} {
		rawPublish(t, c, cfg.Queue, amqp.Publishing{
			Headers: amqp.Table{ackwise.HeaderEventID: id, "CC": []any{audit}},
			Body:    []byte(id),
		})
	}
	if got := len(getAll(t, c, audit)); got != 2 {
		t.Fatalf("audit queue got %d copies from the producer, want 2", got)
	}
	byID := map[string]*ackwise.Message{}
	for len(byID) < 2 {
		m := receive(t, src)
		byID[m.ID] = m
	}
	if err := src.Nack(ctxT(t), byID["retry"], time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := src.DeadLetter(ctxT(t), byID["dead"], dlq.Envelope{Reason: dlq.ReasonPermanent}); err != nil {
		t.Fatal(err)
	}
	if got := len(getAll(t, c, audit)); got != 0 {
		t.Errorf("moves sent %d copies to the CC queue, want 0", got)
	}
	wait := WaitQueueName(cfg.Queue, time.Minute)
	if n := queueDepth(t, c, wait); n != 1 {
		t.Errorf("wait queue holds %d, want 1", n)
	}
	dead := getAll(t, c, cfg.Queue+".dlq")
	if len(dead) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dead))
	}
	if _, ok := dead[0].Headers["CC"]; ok {
		t.Errorf("dead letter still carries CC: %v", dead[0].Headers)
	}
}

// TestCoalescedAcksConcurrentSettles: many goroutines ack, release or keep
// deliveries at once while the flusher coalesces acks. Once the consumer is
// gone, the broker must hand out again exactly the released and the kept
// ones: a coalesced ack never covered either.
func TestCoalescedAcksConcurrentSettles(t *testing.T) {
	t.Parallel()
	const total = 400
	needBroker(t)
	cfg := testConfig(t, Classic)
	cfg.Prefetch = total
	declare(t, cfg)
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName})
	msgs := make([]*ackwise.Message, total)
	for i := range msgs {
		msgs[i] = &ackwise.Message{ID: strconv.Itoa(i), Payload: []byte{byte(i)}}
	}
	if err := sink.Publish(ctxT(t), msgs...); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	src, err := NewSource(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	work := make(chan *ackwise.Message, total)
	buf := make([]*ackwise.Message, 64)
	for got := 0; got < total; {
		n, err := src.Receive(ctx, buf)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range buf[:n] {
			work <- m
		}
		got += n
	}
	close(work)
	// Deterministic per ID, spread over the tags: 0 ack, 1 release, 2 keep.
	fate := func(id string) int {
		n, _ := strconv.Atoi(id)
		return (n*7 + n/5) % 3
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range work {
				var err error
				switch fate(m.ID) {
				case 0:
					err = src.Ack(ctx, m)
				case 1:
					err = src.Release(ctx, m)
				}
				if err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	src.Close()

	want := map[string]bool{}
	for i := range total {
		if id := strconv.Itoa(i); fate(id) != 0 {
			want[id] = true
		}
	}
	again := newSource(t, cfg)
	got := map[string]bool{}
	for len(got) < len(want) {
		m := receive(t, again)
		if !want[m.ID] {
			t.Fatalf("acked message %s delivered again", m.ID)
		}
		got[m.ID] = true
	}
	// Anything acked that should not have been shows up here; nothing
	// signals its absence, so wait a little.
	short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelShort()
	for {
		n, err := again.Receive(short, buf)
		if err != nil {
			break
		}
		for _, m := range buf[:n] {
			if !want[m.ID] {
				t.Fatalf("acked message %s delivered again", m.ID)
			}
		}
	}
}

// TestConcurrentPublishReturnsMatchTheirCalls: Publish calls share one
// confirm channel; each unroutable message must fail the call that sent
// it, and only that one.
func TestConcurrentPublishReturnsMatchTheirCalls(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	good := "good-" + cfg.Queue
	if err := withChannel(c, func(ch *amqp.Channel) error {
		return ch.QueueBind(cfg.Queue, good, "amq.direct", false, nil)
	}); err != nil {
		t.Fatal(err)
	}
	sink := newSink(t, SinkConfig{URL: cfg.URL, Exchange: "amq.direct", ConnectionName: cfg.ConnectionName})
	const callers, rounds, batch = 6, 10, 16
	var wg sync.WaitGroup
	var routed atomic.Int64
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				msgs := make([]*ackwise.Message, batch)
				// Caller g's round r has an unroutable message only when
				// (g+r) is odd, at position (g+r)%batch.
				bad := -1
				if (g+r)%2 == 1 {
					bad = (g + r) % batch
				}
				for i := range msgs {
					key := good
					if i == bad {
						key = fmt.Sprintf("bad-%d-%d-%s", g, r, cfg.Queue)
					}
					msgs[i] = &ackwise.Message{ID: fmt.Sprintf("%d-%d-%d", g, r, i), Key: key, Payload: []byte("x")}
				}
				err := sink.Publish(ctxT(t), msgs...)
				switch {
				case bad < 0 && err != nil:
					t.Errorf("caller %d round %d: all routable, got %v", g, r, err)
				case bad >= 0 && (!errors.Is(err, ErrUnroutable) || !strings.Contains(err.Error(), fmt.Sprintf("bad-%d-%d-", g, r))):
					t.Errorf("caller %d round %d: want ErrUnroutable for its own bad key, got %v", g, r, err)
				case bad >= 0 && strings.Count(err.Error(), "bad-") != 1:
					t.Errorf("caller %d round %d: other calls' returns reported: %v", g, r, err)
				}
				routed.Add(batch)
				if bad >= 0 {
					routed.Add(-1)
				}
			}
		}()
	}
	wg.Wait()
	if n := queueDepth(t, c, cfg.Queue); n != int(routed.Load()) {
		t.Fatalf("queue holds %d, want the %d routable messages", n, routed.Load())
	}
}

// TestPublishHonoursContextWhileChannelBusy: a Publish queued behind
// another that holds the channel (its write blocked, as when the broker
// blocks publishers in a resource alarm) gives up when its ctx ends.
func TestPublishHonoursContextWhileChannelBusy(t *testing.T) {
	t.Parallel()
	needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName})
	s, err := sink.p.session(ctxT(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.lockPublish(context.Background()) // the stuck writer
	released := false
	release := func() {
		if !released {
			released = true
			s.unlockPublish()
		}
	}
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- sink.Publish(ctx, &ackwise.Message{ID: "p", Payload: []byte("x")}) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Publish: %v, want context.DeadlineExceeded", err)
		}
	case <-time.After(5 * time.Second):
		release()
		<-done
		t.Fatal("Publish ignored its ctx while the channel was busy")
	}
	release()
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "q", Payload: []byte("y")}); err != nil {
		t.Fatalf("Publish once the channel is free: %v", err)
	}
}

// TestMoveStopsWaitingWhenDeliveryVoid: a Nack waiting for the moves
// connection to come back returns ErrReceiptInvalid as soon as the channel
// that delivered its message dies, instead of holding its worker (and the
// engine's drain) until the broker is reachable again.
func TestMoveStopsWaitingWhenDeliveryVoid(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic, time.Minute)
	// Reconnections wait a minute: the moves connection stays down.
	cfg.ReconnectInitialInterval, cfg.ReconnectMaxInterval = time.Minute, time.Minute
	declare(t, cfg)
	src := newSource(t, cfg)
	rawPublish(t, c, cfg.Queue, amqp.Publishing{Headers: amqp.Table{ackwise.HeaderEventID: "v"}, Body: []byte("v")})
	m := receive(t, src)
	if n := closeConnections(t, cfg.ConnectionName+`-moves"`); n != 1 {
		t.Fatalf("closed %d moves connections, want 1", n)
	}
	// The publisher's death reaches the client asynchronously.
	deadline := time.Now().Add(testTimeout)
	for {
		src.pub.mu.Lock()
		down := src.pub.cur == nil
		src.pub.mu.Unlock()
		if down {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("moves publisher did not notice its connection closed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	done := make(chan error, 1)
	go func() { done <- src.Nack(context.Background(), m, time.Minute) }()
	select {
	case err := <-done:
		t.Fatalf("Nack returned %v while its delivery was valid and the mover down", err)
	case <-time.After(100 * time.Millisecond):
	}
	if n := closeConnections(t, cfg.ConnectionName+`"`); n != 1 {
		t.Fatalf("closed %d consumer connections, want 1", n)
	}
	select {
	case err := <-done:
		if !errors.Is(err, adapters.ErrReceiptInvalid) {
			t.Fatalf("Nack: %v, want ErrReceiptInvalid", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Nack still waiting for the mover after its delivery became void")
	}
	if n := queueDepth(t, c, WaitQueueName(cfg.Queue, time.Minute)); n != 0 {
		t.Fatalf("wait queue holds %d, want 0", n)
	}
}
