package rabbitmq

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
)

// TestConsumerTimeoutWarningCountsPrefetchedTime: the broker's
// consumer_timeout runs from the moment it delivers a message to the
// channel, prefetched or not. A delivery that waited in the client's
// prefetch buffer before Receive took it has been held that long already;
// the warning must count that time, or a delivery can reach the timeout
// (and the broker close the channel) without the warning that is meant to
// come first.
func TestConsumerTimeoutWarningCountsPrefetchedTime(t *testing.T) {
	c := needBroker(t)
	cfg := testConfig(t, Classic)
	cfg.Prefetch = 10
	cfg.ConsumerTimeout = time.Minute
	cfg.ConsumerTimeoutWarn = 300 * time.Millisecond
	var warned atomic.Int64
	cfg.MeterProvider = countingMeter{n: &warned}
	declare(t, cfg)
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName})
	src := newSource(t, cfg)
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "a", Payload: []byte("a")}, &ackwise.Message{ID: "b", Payload: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	a := receive(t, src)
	// Both are delivered to the channel (none left ready in the queue).
	deadline := time.Now().Add(5 * time.Second)
	for queueDepth(t, c, cfg.Queue) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("b never delivered to the consumer")
		}
		time.Sleep(10 * time.Millisecond)
	}
	delivered := time.Now()
	time.Sleep(600 * time.Millisecond) // b waits in the prefetch buffer
	b := receive(t, src)
	time.Sleep(150 * time.Millisecond)
	if n := warned.Load(); n != 2 {
		t.Errorf("%d warnings %v after b was delivered, want 2 (a and b both held past ConsumerTimeoutWarn %v by the broker's clock)", n, time.Since(delivered).Round(time.Millisecond), cfg.ConsumerTimeoutWarn)
	}
	for _, m := range []*ackwise.Message{a, b} {
		if err := src.Ack(ctxT(t), m); err != nil {
			t.Fatal(err)
		}
	}
}
