package rabbitmq

import (
	"log/slog"
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
	cfg, src, warned, logs := warnPair(t)
	a := receive(t, src)
	// Both are delivered to the channel (none left ready in the queue).
	deadline := time.Now().Add(5 * time.Second)
	for queueDepth(t, c, cfg.Queue) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("b never delivered to the consumer")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(600 * time.Millisecond) // b waits in the prefetch buffer
	received := time.Now()
	b := receive(t, src)
	// Await b's warning. It must count the time b spent in the prefetch
	// buffer: held, taken at the watcher's tick, exceeds the time since
	// Receive began (the record's time is at or after that tick). Counted
	// from Receive, held could be no more than that.
	timeout := time.After(testTimeout)
	for warnedB := false; !warnedB; {
		select {
		case r := <-logs:
			var id, held string
			r.Attrs(func(a slog.Attr) bool {
				switch a.Key {
				case "message_id":
					id = a.Value.String()
				case ackwise.LogKeyDuration:
					held = a.Value.String()
				}
				return true
			})
			if id != "b" {
				continue
			}
			warnedB = true
			d, err := time.ParseDuration(held)
			if err != nil {
				t.Fatalf("warning for b: held %q: %v", held, err)
			}
			if since := r.Time.Sub(received); d <= since {
				t.Errorf("b warned as held %v, no more than the %v since Receive: the time in the prefetch buffer was not counted", d, since)
			}
		case <-timeout:
			t.Fatal("no consumer-timeout warning for b")
		}
	}
	if n := warned.Load(); n != 2 {
		t.Errorf("%d warnings, want 2 (a and b both held past ConsumerTimeoutWarn %v by the broker's clock)", n, cfg.ConsumerTimeoutWarn)
	}
	for _, m := range []*ackwise.Message{a, b} {
		if err := src.Ack(ctxT(t), m); err != nil {
			t.Fatal(err)
		}
	}
}

// warnPair declares a classic queue whose source warns 300ms into a
// delivery (the timeout itself a minute, prefetch 10), publishes a and b
// to it, and returns the source with its warning counter and logs.
func warnPair(t *testing.T) (Config, *Source, *atomic.Int64, chan slog.Record) {
	t.Helper()
	cfg := testConfig(t, Classic)
	cfg.Prefetch = 10
	cfg.ConsumerTimeout = time.Minute
	cfg.ConsumerTimeoutWarn = 300 * time.Millisecond
	var warned atomic.Int64
	cfg.MeterProvider = countingMeter{n: &warned}
	logs := make(chan slog.Record, 16)
	cfg.Logger = slog.New(recordHandler{ch: logs})
	declare(t, cfg)
	sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName})
	src := newSource(t, cfg)
	if err := sink.Publish(ctxT(t), &ackwise.Message{ID: "a", Payload: []byte("a")}, &ackwise.Message{ID: "b", Payload: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	return cfg, src, &warned, logs
}
