package rabbitmq

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
)

// countOutcomes is a consumer.Observer that counts dead letters.
type countOutcomes struct{ deadLettered *atomic.Int32 }

func (c countOutcomes) Observe(_ *ackwise.Message, o consumer.Outcome, _ time.Duration) {
	if o == consumer.DeadLettered {
		c.deadLettered.Add(1)
	}
}

// A message with a header of ~130.5 KB fits in a frame as its producer
// sent it (16 bytes to spare), but its dead letter, with the envelope added, did not: the broker
// closed the moves connection on it (frame_too_large), the publisher sent
// it again on every new connection, with every other dead letter
// unconfirmed on it, so it was never dead-lettered and the others were
// written again and again. Now the dead letter loses its largest header,
// named in ackwise-trimmed-headers, its payload byte for byte; every other
// dead letter of the batch is written once, and no connection is lost.
func TestOversizedDeadLetterIsTrimmed(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	logs := &logRecorder{}
	cfg.Logger = slog.New(logs)
	declare(t, cfg)
	v, err := cfg.validate()
	if err != nil {
		t.Fatal(err)
	}
	const n, big = 8, 3
	payload := make([]byte, 3000)
	_, _ = rand.Read(payload)
	for i := range n {
		id := fmt.Sprintf("m-%d", i)
		p := amqp.Publishing{MessageId: id, Headers: amqp.Table{ackwise.HeaderEventID: id, "x-tenant": "acme"}, Body: []byte(id)}
		if i == big {
			// Just under frame_max as sent: 16 bytes to spare.
			p.Headers["big"] = ""
			size, err := headerFrameSize(&p)
			if err != nil {
				t.Fatal(err)
			}
			p.Headers["big"] = strings.Repeat("b", clientFrameMax-16-size)
			p.Body = payload
		}
		rawPublish(t, c, cfg.Queue, p)
	}
	var dead atomic.Int32
	src := &movesSeen{Source: newSource(t, cfg), errs: make(chan error, 1024)}
	var runs atomic.Int32
	stop := runEngine(t, src, failPermanently(&runs), consumer.Config{Concurrency: n, Observer: countOutcomes{&dead}})
	deadline := time.Now().Add(3 * testTimeout)
	for dead.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages dead-lettered; %d connections lost", dead.Load(), n, len(logs.matching("channel lost")))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err, _ := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	src.Close()

	seen := map[string]int{}
	for _, d := range getAll(t, c, v.DeadLetterQueue) {
		id, _ := d.Headers[ackwise.HeaderEventID].(string)
		seen[id]++
		if d.Headers[dlq.HeaderReason] != string(dlq.ReasonPermanent) || d.Headers["x-tenant"] != "acme" {
			t.Errorf("dead letter %s: envelope or headers missing: %v", id, d.Headers)
		}
		if id == fmt.Sprintf("m-%d", big) {
			if _, ok := d.Headers["big"]; ok || d.Headers[HeaderTrimmed] != `["big"]` || !bytes.Equal(d.Body, payload) {
				t.Errorf("oversized dead letter: big kept %v, %s = %v, payload identical %v", ok, HeaderTrimmed, d.Headers[HeaderTrimmed], bytes.Equal(d.Body, payload))
			}
		} else if string(d.Body) != id || d.Headers[HeaderTrimmed] != nil {
			t.Errorf("dead letter %s changed: body %q, %s %v", id, d.Body, HeaderTrimmed, d.Headers[HeaderTrimmed])
		}
	}
	for i := range n {
		if id := fmt.Sprintf("m-%d", i); seen[id] != 1 {
			t.Errorf("%s dead-lettered %d times, want once (all: %v)", id, seen[id], seen)
		}
	}
	if lost := logs.matching("channel lost"); len(lost) > 0 {
		t.Errorf("%d connections lost; the first: %s %s", len(lost), lost[0].Message, attr(lost[0], "error"))
	}
	if w := logs.matching("headers removed"); len(w) != 1 || attr(w[0], "message_id") != fmt.Sprintf("m-%d", big) {
		t.Errorf("warnings of removed headers: %v", w)
	}
	if d := queueDepth(t, c, cfg.Queue); d != 0 {
		t.Errorf("%d messages left in the work queue", d)
	}
}

// A Sink.Publish of messages of which one has headers too large for a
// frame (and one a message-id too long for AMQP): those two fail alone,
// permanently, before anything is sent; the others are confirmed and
// stored once; no connection is lost. Before, the broker closed the
// connection on the large one and the sink sent it, and the others with
// it, again on every new connection until ctx ended.
func TestSinkOversizedHeadersFailAlone(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	logs := &logRecorder{}
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName, Logger: slog.New(logs)})
	var msgs []*ackwise.Message
	for i := range 6 {
		msgs = append(msgs, &ackwise.Message{ID: fmt.Sprintf("s-%d", i), Payload: []byte{byte(i)}})
	}
	msgs[2].Headers = ackwise.HeadersOf("big", strings.Repeat("b", 131_100))
	msgs[4].ID = strings.Repeat("i", 300)
	ctx, cancel := context.WithTimeout(context.Background(), 2*testTimeout)
	defer cancel()
	err := sink.Publish(ctx, msgs...)
	failed := adapters.PublishFailures(err, len(msgs))
	if len(failed) != 2 || failed[0].Index != 2 || failed[1].Index != 4 {
		t.Fatalf("Publish: %v; want messages 2 and 4 alone to fail", err)
	}
	if !errors.Is(failed[0].Err, ErrHeadersTooLarge) {
		t.Errorf("message 2: %v, want ErrHeadersTooLarge", failed[0].Err)
	}
	for _, f := range failed {
		if ackwise.ClassOf(f.Err) != ackwise.ClassPermanent {
			t.Errorf("message %d: %v classed %v, want permanent", f.Index, f.Err, ackwise.ClassOf(f.Err))
		}
	}
	seen := map[string]int{}
	for _, d := range getAll(t, c, cfg.Queue) {
		seen[d.MessageId]++
	}
	for _, i := range []int{0, 1, 3, 5} {
		if id := msgs[i].ID; seen[id] != 1 {
			t.Errorf("%s stored %d times, want once (all: %v)", id, seen[id], seen)
		}
	}
	if len(seen) != 4 {
		t.Errorf("stored %v, want the 4 that fit", seen)
	}
	if lost := logs.matching("channel lost"); len(lost) > 0 {
		t.Errorf("%d connections lost; the first: %s", len(lost), attr(lost[0], "error"))
	}
}
