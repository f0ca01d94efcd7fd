package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// TestRedriveTargetDownEndsTheRun: a redrive whose target goes down after
// its first move ends with an error once a publish is not confirmed within
// RedriveOptions.PublishTimeout, and leaves the dead letters it did not
// move in the dead-letter queue. Before, the sink waited for the target to
// come back for as long as the run's ctx lasted: the CLI, whose ctx ends
// only on an interrupt, hung for as long as the target was down, against
// docs/redrive.md (a target that is down fails the run, exit 1).
func TestRedriveTargetDownEndsTheRun(t *testing.T) {
	t.Parallel()
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	declare(t, cfg)
	dlqName := cfg.Queue + ".dlq"
	target := cfg.Queue + ".target"
	plainQueue(t, c, target)
	const n = 3
	for i := range n {
		h := dlq.Envelope{Reason: dlq.ReasonPermanent, Error: "boom", ErrorClass: "permanent", Source: cfg.Queue, Partition: -1, Offset: -1, Attempts: 1}.Apply(nil)
		tbl := amqp.Table{ackwise.HeaderEventID: fmt.Sprintf("ev-%d", i)}
		for _, kv := range h {
			tbl[kv.Key] = kv.Value
		}
		rawPublish(t, c, dlqName, amqp.Publishing{MessageId: fmt.Sprintf("ev-%d", i), Headers: tbl, DeliveryMode: amqp.Persistent, Body: []byte{byte(i)}})
	}

	proxy, proxied := newHandshakeProxy(t)
	from := newSource(t, Config{URL: cfg.URL, Queue: dlqName, Plain: true})
	to := newSink(t, SinkConfig{URL: proxied, RoutingKey: target,
		ReconnectInitialInterval: 20 * time.Millisecond, ReconnectMaxInterval: 50 * time.Millisecond})

	ctx := ctxT(t) // 20s: the run must end well before
	start := time.Now()
	res, err := dlq.Redrive(ctx, from, to, dlq.RedriveOptions{
		Rate: dlq.RateUnlimited, IdleTimeout: 500 * time.Millisecond, PublishTimeout: time.Second,
		OnMessage: func(_ *ackwise.Message, _ dlq.Envelope, a dlq.Action) {
			if a == dlq.ActionMoved {
				// The target goes down: every reconnection fails.
				proxy.setFault(resetHandshake)
				proxy.closeAll()
			}
		},
	})
	if ctx.Err() != nil {
		t.Fatalf("Redrive ran until its ctx ended (%v): %+v, %v", time.Since(start), res, err)
	}
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || res.Stop != dlq.StopError || res.Moved != 1 || res.Failed != 1 {
		t.Fatalf("Redrive with the target down: %+v, %v; want 1 moved, 1 failed, StopError and the publish's deadline", res, err)
	}

	// Nothing lost: the two not moved are back in the dead-letter queue
	// once the source lets go of them (RabbitMQ requeues asynchronously).
	from.Close()
	deadline := time.Now().Add(5 * time.Second)
	for queueDepth(t, c, dlqName) != n-1 {
		if time.Now().After(deadline) {
			t.Fatalf("dead-letter queue holds %d, want %d", queueDepth(t, c, dlqName), n-1)
		}
		time.Sleep(20 * time.Millisecond) // polling the broker's count: no event to wait for
	}
	if got := queueDepth(t, c, target); got != 1 {
		t.Fatalf("target holds %d, want the 1 moved", got)
	}
}
