package rabbitmq

import (
	"context"
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
		}
	}}
}

// deliveryMessage decodes a dead letter read with basic.get.
func deliveryMessage(d amqp.Delivery) *ackwise.Message {
	h := fromTable(d.Headers)
	return &ackwise.Message{ID: h.Get(ackwise.HeaderEventID), Key: h.Get(HeaderKey), Payload: d.Body, Headers: h, BrokerID: d.MessageId, Partition: -1, Offset: -1}
}
