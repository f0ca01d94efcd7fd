package consumer_test

import (
	"sync"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
)

// waitStats polls c.Stats until ok or the timeout (no event exists for it).
func waitStats(c *consumer.Consumer, timeout time.Duration, ok func(consumer.Stats) bool) bool {
	deadline := time.Now().Add(timeout)
	for !ok(c.Stats()) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// outcomeLog records every outcome observed, and runs on, if set, on each.
type outcomeLog struct {
	mu  sync.Mutex
	all []consumer.Outcome
	on  func(consumer.Outcome)
}

func (o *outcomeLog) Observe(_ *ackwise.Message, out consumer.Outcome, _ time.Duration) {
	o.mu.Lock()
	o.all = append(o.all, out)
	o.mu.Unlock()
	if o.on != nil {
		o.on(out)
	}
}
