package rabbitmq

import (
	"log/slog"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
)

// TestConsumerTimeoutWarningForUnreceivedDelivery: the broker's
// consumer_timeout runs for every delivery it pushed to the channel, also
// one still waiting in the prefetch buffer because the engine is at its
// in-flight limit (Prefetch set larger, as the package doc advises) or
// paused. Such a delivery reaches the timeout, and the broker closes the
// channel, while never Received: the warning must cover it too. Before, the
// watcher looked only at deliveries Receive had handed out, so b was never
// warned about while it waited.
func TestConsumerTimeoutWarningForUnreceivedDelivery(t *testing.T) {
	needBroker(t)
	cfg, src, warned, logs := warnPair(t)
	a := receive(t, src) // "in its handler"; b stays in the prefetch buffer
	timeout := time.After(10 * time.Second)
	for seen := map[string]bool{}; !seen["b"]; {
		select {
		case r := <-logs:
			r.Attrs(func(at slog.Attr) bool {
				if at.Key == "message_id" {
					seen[at.Value.String()] = true
				}
				return true
			})
		case <-timeout:
			t.Fatalf("no consumer-timeout warning for b, held in the prefetch buffer past ConsumerTimeoutWarn %v (warned about %d deliveries)", cfg.ConsumerTimeoutWarn, warned.Load())
		}
	}
	// Once received, b is not warned about a second time.
	b := receive(t, src)
	ss := b.Handle.(*receipt).s
	src.warnSlow(ss, time.Now())
	if n := warned.Load(); n != 2 {
		t.Errorf("%d warnings, want 2 (a and b, once each)", n)
	}
	for _, m := range []*ackwise.Message{a, b} {
		if err := src.Ack(ctxT(t), m); err != nil {
			t.Fatal(err)
		}
	}
}
