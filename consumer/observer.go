package consumer

import (
	"sync/atomic"
	"time"

	"github.com/ackwise/ackwise"
)

// Outcome is what the engine did with a message after a handler run.
type Outcome int

const (
	// Acked: the handler returned nil and the message was acknowledged.
	Acked Outcome = iota
	// Retried: the handler failed and the message will be delivered again.
	Retried
	// DeadLettered: the message was moved to the dead-letter destination.
	DeadLettered
	// Discarded: the handler returned a discard error; the message was
	// acknowledged and dropped.
	Discarded
	// Released: the message was handed back unsettled (shutdown, including
	// messages the open breaker held; a lost receipt; queued in its lane
	// behind a message of its key that went back to the broker unsettled).
	// A message whose in-place retry was observed as Retried and which is
	// handed back before its next attempt runs is not observed again: the
	// broker's redelivery is its retry, as for a retry at the broker.
	Released
	// SettleFailed: the broker refused the settle call. A failed Ack, or a
	// move whose receipt went with it, hands the message back (the broker
	// redelivers it); a failed move (Nack, DeadLetter) of a message still
	// this consumer's is tried again in place, each failed try observed.
	SettleFailed
)

var outcomeNames = [...]string{"acked", "retried", "dead-lettered", "discarded", "released", "settle-failed"}

func (o Outcome) String() string {
	if o >= 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "unknown"
}

// Observer is told each outcome, for metrics. Observe must be fast and safe
// for concurrent use, and must not keep msg after returning (the source may
// reuse it); elapsed is the handler's run time, zero for an outcome without
// a run of its own: Released, and a failed move (Nack, DeadLetter) tried
// again in place, whose run came with its first SettleFailed.
type Observer interface {
	Observe(msg *ackwise.Message, o Outcome, elapsed time.Duration)
}

// Stats are counters since the consumer was created.
type Stats struct {
	Received      uint64
	Acked         uint64
	Retried       uint64
	DeadLettered  uint64
	Discarded     uint64
	Released      uint64
	SettleFailed  uint64
	Panics        uint64
	ReceiveErrors uint64
	// InFlight is the number of messages received and not yet settled.
	InFlight int
	// Paused reports whether the breaker holds consumption paused.
	Paused bool
	// Held is the number of messages the open breaker holds in flight,
	// waiting for the dependency to come back (a running probe is not
	// counted).
	Held int
	// BreakerTrips counts how often the breaker opened.
	BreakerTrips int
}

type counters struct {
	received, receiveErrors, panics atomic.Uint64
	outcomes                        [len(outcomeNames)]atomic.Uint64
}
