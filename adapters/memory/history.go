package memory

import (
	"fmt"
	"time"

	"github.com/ackwise/ackwise/dlq"
)

// EventKind says what happened to a message in the broker's history.
type EventKind int

// Event kinds.
const (
	// EventPublished: a sink (or a dead-lettering) stored the message.
	EventPublished EventKind = iota + 1
	// EventDelivered: a source handed the message out; Attempt is its
	// delivery number.
	EventDelivered
	// EventAcked: a source settled the message as done (on a log: marked the
	// record settled).
	EventAcked
	// EventNacked: a source asked for redelivery after Delay.
	EventNacked
	// EventDeadLettered: the message was moved to the dead-letter destination
	// To, by a source (Envelope set) or by the broker's own redrive after
	// MaxReceives (Envelope nil, Reason max-attempts).
	EventDeadLettered
	// EventReleased: a source handed the message back unsettled.
	EventReleased
	// EventExpired: the message's lease ran out and it became visible again.
	// Time is the lease's deadline. The broker notices the expiry at its
	// next look at the queue (a Receive, Stats, or the wake-up of a blocked
	// receiver), so the event can follow, in Seq, events of later times.
	EventExpired
	// EventCommitted: a consumer group's committed offset of Partition moved
	// to Offset.
	EventCommitted
	// EventRebalanced: a consumer group's partitions were reassigned (a
	// member joined, left or crashed, or offsets were reset).
	EventRebalanced
	// EventCrashed: a source crashed (an injected crash or Crash()).
	EventCrashed
	// EventFault: an injected fault fired; Fault says which.
	EventFault
)

var eventKindNames = [...]string{"", "published", "delivered", "acked", "nacked", "dead-lettered", "released", "expired", "committed", "rebalanced", "crashed", "fault"}

// String returns the kind's name ("acked", "dead-lettered", …).
func (k EventKind) String() string { return nameOf(eventKindNames[:], int(k), "event") }

// Event is one entry of a queue's or topic's history, recorded under the
// destination's lock in the order things happened.
type Event struct {
	// Seq orders events across the whole broker.
	Seq uint64
	// Kind says what happened.
	Kind EventKind
	// Time is the broker clock's time of the event.
	Time time.Time
	// Dest is the queue or topic.
	Dest string
	// Consumer is the source's ID ("orders#2", "events/billing#1"); empty for
	// publishes and broker-side moves.
	Consumer string
	// Group is the consumer group on a log.
	Group string
	// ID is the event ID (Message.ID); Key the message key; BrokerID the
	// broker's own ID of the stored message.
	ID       string
	Key      string
	BrokerID string
	// Partition and Offset locate a record on a log; -1 on a queue.
	Partition int32
	Offset    int64
	// Attempt is the delivery number of the delivery the event is about.
	Attempt int
	// Delay is a Nack's delay.
	Delay time.Duration
	// Reason, Envelope and To describe a dead-lettering. Envelope is nil for
	// the broker's own redrive after MaxReceives.
	Reason   dlq.Reason
	Envelope *dlq.Envelope
	To       string
	// Fault is the kind of fault that fired (EventFault, EventCrashed).
	Fault FaultKind
}

// String renders the event on one line for failure messages.
func (e Event) String() string {
	s := fmt.Sprintf("#%d %s %s", e.Seq, e.Kind, e.Dest)
	if e.Consumer != "" {
		s += " by " + e.Consumer
	}
	if e.ID != "" {
		s += " id=" + e.ID
	}
	if e.Key != "" {
		s += " key=" + e.Key
	}
	if e.Partition >= 0 {
		s += fmt.Sprintf(" p%d@%d", e.Partition, e.Offset)
	}
	if e.Attempt > 0 {
		s += fmt.Sprintf(" attempt=%d", e.Attempt)
	}
	if e.Delay > 0 {
		s += fmt.Sprintf(" delay=%v", e.Delay)
	}
	if e.Reason != "" {
		s += fmt.Sprintf(" reason=%s to=%s", e.Reason, e.To)
	}
	if e.Fault != 0 {
		s += " fault=" + e.Fault.String()
	}
	return s
}

// deadLettered returns ev with what a dead-lettering event adds: the
// reason, a copy of the envelope and the dead-letter destination.
func deadLettered(ev Event, env dlq.Envelope, to string) Event {
	ev.Reason, ev.Envelope, ev.To = env.Reason, &env, to
	return ev
}
