package rabbitmq

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
)

// TestKilledSessionNeverMultipleAcksUnsettled: kill clears the in-flight list
// (head = nil) while the channel may still be open (kill closes the
// connection asynchronously; Receive kills on a broker consumer-cancel, run
// kills on Close). A flush that runs then sees no oldest unsettled delivery
// and writes basic.ack multiple=true up to the highest recorded tag, acking
// deliveries still in a handler: they were never redelivered (lost). Now a
// flush after the kill writes nothing, and the broker redelivers both.
func TestKilledSessionNeverMultipleAcksUnsettled(t *testing.T) {
	c := needBroker(t)
	lost := 0
	const rounds = 2
	for round := range rounds {
		cfg := testConfig(t, Classic)
		cfg.Prefetch = 10
		declare(t, cfg)
		sink := newSink(t, SinkConfig{URL: cfg.URL, RoutingKey: cfg.Queue, ConnectionName: cfg.ConnectionName})
		msgs := []*ackwise.Message{{ID: "a", Payload: []byte("a")}, {ID: "b", Payload: []byte("b")}}
		if err := sink.Publish(ctxT(t), msgs...); err != nil {
			t.Fatal(err)
		}
		src := newSource(t, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		byID := map[string]*ackwise.Message{}
		buf := make([]*ackwise.Message, 2)
		for len(byID) < 2 {
			n, err := src.Receive(ctx, buf)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range buf[:n] {
				byID[m.ID] = m
			}
		}
		cancel()
		ss := byID["a"].Handle.(*receipt).s
		// "a" is still in its handler; "b" finished. Its ack is recorded,
		// and the session dies before it is written.
		ss.flushMu.Lock()
		if err := src.Ack(ctxT(t), byID["b"]); err != nil {
			t.Fatal(err)
		}
		ss.kill(errors.New("consumer cancelled by the broker"))
		ss.flushMu.Unlock()
		ss.flush() // what the flusher has not written yet, after the kill
		src.Close()
		// "a" was never settled: the broker must requeue it once the
		// connection is gone (it has no notification of that: poll).
		deadline := time.Now().Add(5 * time.Second)
		n := queueDepth(t, c, cfg.Queue)
		for ; n == 0 && time.Now().Before(deadline); n = queueDepth(t, c, cfg.Queue) {
			time.Sleep(20 * time.Millisecond)
		}
		if n == 0 {
			lost++
			t.Logf("round %d: queue %s empty: unsettled delivery a was acked by a multiple ack", round, cfg.Queue)
		} else {
			t.Logf("round %d: depth %s", round, strconv.Itoa(n))
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d rounds lost an unsettled delivery", lost, rounds)
	}
}
