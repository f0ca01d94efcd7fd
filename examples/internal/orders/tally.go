package orders

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
)

// Tally is a consumer.Observer that passes every outcome on to another
// Observer (the metrics) and counts those of the messages whose IDs start
// with a prefix (a demo run's), so that the example can say what became of
// them and stop once all are settled.
type Tally struct {
	next   consumer.Observer
	prefix string
	want   int

	mu      sync.Mutex
	settled map[string]consumer.Outcome // by event ID: acked, dead-lettered or discarded
	retried int
	done    chan struct{}
}

// NewTally returns a Tally passing outcomes on to next (nil: none) and
// waiting for want messages whose IDs start with prefix.
func NewTally(next consumer.Observer, prefix string, want int) *Tally {
	t := &Tally{next: next, prefix: prefix, want: want, settled: map[string]consumer.Outcome{}, done: make(chan struct{})}
	if want == 0 {
		close(t.done)
	}
	return t
}

// Observe implements consumer.Observer.
func (t *Tally) Observe(msg *ackwise.Message, o consumer.Outcome, elapsed time.Duration) {
	if t.next != nil {
		t.next.Observe(msg, o, elapsed)
	}
	if t.prefix == "" || !strings.HasPrefix(msg.ID, t.prefix) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch o {
	case consumer.Retried:
		t.retried++
	case consumer.Acked, consumer.DeadLettered, consumer.Discarded:
		if _, seen := t.settled[msg.ID]; seen {
			return
		}
		t.settled[strings.Clone(msg.ID)] = o // msg is the source's, not ours to keep
		if len(t.settled) == t.want {
			close(t.done)
		}
	}
}

// Done is closed once every message waited for was settled.
func (t *Tally) Done() <-chan struct{} { return t.done }

// Summary is what became of a demo run's orders.
type Summary struct {
	Orders       int    // published
	Acked        int    // settled by an ack (shipped, or a duplicate absorbed)
	DeadLettered int    // settled by a dead letter
	Retried      int    // failed attempts retried
	Shipped      int    // distinct orders with a shipment
	Shipments    int    // shipment rows: more than Shipped is an order shipped twice
	Absorbed     int64  // redeliveries the inbox acked without running the handler
	IDPrefix     string // the demo orders' event IDs start with it
}

func (s Summary) String() string {
	return fmt.Sprintf("orders=%d acked=%d dead_lettered=%d retried=%d shipped=%d double_shipped=%d duplicates_absorbed=%d",
		s.Orders, s.Acked, s.DeadLettered, s.Retried, s.Shipped, s.Shipments-s.Shipped, s.Absorbed)
}

// Summary returns the tally's counts; the caller fills in the rest.
func (t *Tally) Summary() Summary {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Summary{Orders: t.want, Retried: t.retried}
	for _, o := range t.settled {
		switch o {
		case consumer.Acked:
			s.Acked++
		case consumer.DeadLettered:
			s.DeadLettered++
		}
	}
	return s
}
