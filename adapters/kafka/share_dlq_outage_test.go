package kafka

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
)

// TestShareDeadLetterOutageKeepsRecord: a permanent failure whose dead
// letter the broker refuses for a while (four produces refused here) must
// not lose the record: once the dead letter can be written, it is. Before,
// the engine handed the record back after each refused dead letter, which
// spent a delivery each time, and at the group's delivery limit (3 here)
// the broker archived it: neither handled nor dead-lettered. The engine now
// keeps it locked and tries the dead letter again in place.
func TestShareDeadLetterOutageKeepsRecord(t *testing.T) {
	t.Parallel()
	c := shortLockKfake(t, "30000", "3")
	brokers := c.ListenAddrs()
	cfg := testConfig(t, brokers, 1)
	in := publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })[0]
	src := openShare(t, cfg)

	// The first 4 produces from here on, the dead letters', are refused.
	var mu sync.Mutex
	refused := 0
	c.ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.ProduceRequest)
		mu.Lock()
		defer mu.Unlock()
		if refused >= 4 {
			return nil, nil, false
		}
		refused++
		return refusedProduce(r), nil, true
	})
	var runs atomic.Int32
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
		runs.Add(1)
		return ackwise.Permanent(errors.New("bad payload"))
	})
	log := make(outcomeLog, 64)
	runShareConsumer(t, src, h, consumer.Config{Concurrency: 1, MaxInFlight: 1, Observer: log})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	failed := 0
	for o := awaitOutcome(t, log); o != consumer.DeadLettered; o = awaitOutcome(t, log) {
		if o != consumer.SettleFailed {
			t.Fatalf("outcome %v: want settle-failed until the dead letter is written", o)
		}
		failed++
	}
	if failed != 4 || runs.Load() != 1 {
		t.Fatalf("%d failed dead letters and %d handler runs: want 4 tries refused and the handler run once (the record kept locked, not handed back)", failed, runs.Load())
	}
	dls := readAll(ctx, t, brokers, src.cfg.DeadLetterTopic)
	if len(dls) != 1 || recordMessage(dls[0]).ID != in.ID {
		t.Fatalf("dead letters %v", dls)
	}
}
