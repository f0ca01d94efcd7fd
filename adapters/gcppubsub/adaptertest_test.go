package gcppubsub

import (
	"context"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/adaptertest"
)

// TestConformance runs the conformance suite on pstest, on subscriptions
// without a retry or dead-letter policy (the consumer retries in place and
// counts attempts) and without message ordering: pstest hands out one
// message of an ordering key at a time, until it is acked, where Pub/Sub
// sends several in order, so a case that waits for a key's messages to be
// received together (ReleasedLaneNotOvertaken) cannot pass on it.
// TestOrdered checks an ordered subscription.
func TestConformance(t *testing.T) {
	t.Parallel()
	conformance(t, nil)
}

// TestConformanceDeadLetterPolicy runs the suite on subscriptions with a
// dead-letter policy of 5 deliveries as a backstop to ackwise-managed dead
// letters: Attempt is then Pub/Sub's DeliveryAttempt
// (Capabilities.DeliveryCount).
func TestConformanceDeadLetterPolicy(t *testing.T) {
	t.Parallel()
	conformance(t, dlPolicy(5))
}

// conformance runs the suite on subscriptions shaped by shape.
func conformance(t *testing.T, shape func(*pubsubpb.Subscription)) {
	f := newFake(t)
	adaptertest.Run(t, adaptertest.Harness{Open: func(t testing.TB, fc adaptertest.FixtureConfig) adaptertest.Fixture {
		d := f.create(t, shape)
		// On failure, say what pstest holds unacked.
		t.Cleanup(func() {
			if !t.Failed() {
				return
			}
			for _, m := range f.srv.Messages() {
				if m.Acks == 0 && m.Topic == "projects/"+testProject+"/topics/"+d.topic {
					t.Logf("unacked %s deliveries %d modacks %+v", m.ID, m.Deliveries, m.Modacks)
				}
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		sink, err := NewSink(ctx, d.sinkConfig(f))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sink.Close() })
		return adaptertest.Fixture{
			Sink: sink,
			NewSource: func(t testing.TB) adapters.Source {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				src, err := NewSource(ctx, d.sourceConfig(f))
				if err != nil {
					t.Fatalf("source: %v", err)
				}
				t.Cleanup(func() { src.Close() })
				return src
			},
			DeadLetters: func(ctx context.Context, t testing.TB) []*ackwise.Message {
				return f.deadLetters(ctx, t, d)
			},
		}
	}})
}
