package rabbitmq

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/adaptertest"
)

func TestConformanceClassic(t *testing.T) {
	t.Parallel()
	adaptertest.Run(t, harness(Classic))
}

func TestConformanceQuorum(t *testing.T) {
	t.Parallel()
	adaptertest.Run(t, harness(Quorum))
}

func harness(qt QueueType) adaptertest.Harness {
	return adaptertest.Harness{Open: func(t testing.TB, fc adaptertest.FixtureConfig) adaptertest.Fixture {
		conn := needBroker(t)
		cfg := testConfig(t, qt, fc.DelayTiers...)
		// The fixture declares; sources only verify, so the verification
		// path runs in every case.
		declare(t, cfg)
		v, err := cfg.validate()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		sink, err := NewSink(ctx, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName + "-sink"})
		if err != nil {
			t.Fatalf("sink: %v", err)
		}
		t.Cleanup(func() { sink.Close() })
		var mu sync.Mutex
		var dead []*ackwise.Message
		// A classic queue with reject-publish refuses a message that would
		// take it over max-length-bytes; a quorum queue takes that one and
		// refuses the next ones instead, so it cannot refuse one alone.
		var refuse func(testing.TB, *ackwise.Message)
		if qt == Classic {
			refuse = func(t testing.TB, msg *ackwise.Message) {
				const limit = 64 << 10
				rejectOver(t, conn, cfg.Queue, limit)
				msg.Payload = make([]byte, 2*limit)
			}
		}
		return adaptertest.Fixture{
			Sink: sink,
			NewSource: func(t testing.TB) adapters.Source {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				src, err := NewSource(ctx, cfg)
				if err != nil {
					t.Fatalf("source: %v", err)
				}
				t.Cleanup(func() { src.Close() })
				return src
			},
			DeadLetters: func(ctx context.Context, t testing.TB) []*ackwise.Message {
				mu.Lock()
				defer mu.Unlock()
				for _, d := range getAll(t, conn, v.DeadLetterQueue) {
					dead = append(dead, deliveryMessage(d))
				}
				return append([]*ackwise.Message(nil), dead...)
			},
			Refuse: refuse,
			// The broker closing the source's connection (not the
			// sink's: its name has a suffix).
			Invalidate: func(t testing.TB, _ adapters.Source) {
				if closeConnections(t, cfg.ConnectionName+`"`) == 0 {
					t.Fatalf("no connection named %s to close", cfg.ConnectionName)
				}
			},
		}
	}}
}

// deliveryMessage decodes a dead letter read with basic.get.
func deliveryMessage(d amqp.Delivery) *ackwise.Message {
	h := fromTable(d.Headers)
	return &ackwise.Message{ID: h.Get(ackwise.HeaderEventID), Key: h.Get(HeaderKey), Payload: d.Body, Headers: h, BrokerID: d.MessageId, Partition: -1, Offset: -1}
}

// rejectOver makes queue refuse (basic.nack) a message that would take it
// over limit bytes, with a policy (max-length-bytes, overflow
// reject-publish). It returns once the queue refuses a message of 2*limit
// bytes: the broker applies a policy to its queues after rabbitmqctl
// returns.
func rejectOver(t testing.TB, c *amqp.Connection, queue string, limit int) {
	t.Helper()
	name := "ackwise-test-reject-" + randSuffix()
	def := fmt.Sprintf(`{"max-length-bytes":%d,"overflow":"reject-publish"}`, limit)
	ctl := func(args ...string) {
		if out, err := exec.Command("rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl %v: %v: %s", args, err, out)
		}
	}
	ctl("set_policy", "--apply-to", "queues", "--priority", "100", name, "^"+queue+"$", def)
	t.Cleanup(func() { ctl("clear_policy", name) })
	err := withChannel(c, func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: make([]byte, 2*limit)})
			if err != nil {
				return err
			}
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				return err // nil once refused
			}
			// Taken before the policy applied: take it out again.
			if _, err := ch.QueuePurge(queue, false); err != nil {
				return err
			}
		}
	})
	if err != nil {
		t.Fatalf("policy %s on %s: %v", name, queue, err)
	}
}
