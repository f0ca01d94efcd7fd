package consumer

import (
	"math"
	"time"
)

// NotDraining is Drain.Time, and the value of ackwise.consumer.lag.drain_time,
// when the backlog does not shrink: at the measured rates it is never
// drained.
const NotDraining time.Duration = -1

// Drain is an estimate of how soon a backlog empties, from two samples of
// it (EstimateDrain).
type Drain struct {
	// ConsumeRate is the messages consumed per second over the window.
	ConsumeRate float64
	// IngressRate is the messages that arrived per second over the window:
	// the consume rate plus the backlog's growth (less its shrinking),
	// never below 0. It is right only when consumed counts every consumer
	// of the backlog: with several instances in a group, each counting its
	// own, it reads low (Time is not affected: it uses the backlog alone).
	IngressRate float64
	// Time is how long the backlog takes to drain at the net rate
	// (ConsumeRate − IngressRate, measured as the backlog's shrinking over
	// the window): 0 for an empty backlog, NotDraining when it does not
	// shrink.
	Time time.Duration
}

// Draining reports whether the backlog drains at the measured rates (an
// empty backlog is drained).
func (d Drain) Draining() bool { return d.Time != NotDraining }

// EstimateDrain estimates when a backlog drains: backlog0 and backlog1 are
// its sizes window apart (the broker's counts, e.g. a Kafka group's lag or
// an SQS queue's depth), consumed the messages consumed meanwhile. The time
// to drain is backlog1 ÷ (consume rate − ingress rate), where consume rate −
// ingress rate is how fast the backlog shrank: (backlog0 − backlog1) ÷
// window. A backlog that grew or held steady does not drain (NotDraining);
// an empty backlog1 is drained (0). A window that is not positive, or a
// negative count, tells nothing: the result is NotDraining with zero rates.
// It is a pure function, for the ackwise.consumer.lag.drain_time gauge and
// for tools that sample a backlog themselves.
func EstimateDrain(backlog0, backlog1, consumed int64, window time.Duration) Drain {
	if window <= 0 || backlog0 < 0 || backlog1 < 0 || consumed < 0 {
		return Drain{Time: NotDraining}
	}
	secs := window.Seconds()
	d := Drain{ConsumeRate: float64(consumed) / secs}
	shrink := float64(backlog0-backlog1) / secs // consume − ingress
	d.IngressRate = max(d.ConsumeRate-shrink, 0)
	switch {
	case backlog1 == 0:
		d.Time = 0
	case shrink <= 0:
		d.Time = NotDraining
	default:
		t := float64(backlog1) / shrink * float64(time.Second)
		if t >= math.MaxInt64 { // float64(MaxInt64) is 2^63, past the last Duration
			d.Time = math.MaxInt64
		} else {
			d.Time = time.Duration(t)
		}
	}
	return d
}
