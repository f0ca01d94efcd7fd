package rabbitmq

import (
	"context"
	"time"

	"github.com/ackwise/ackwise"
)

// watchTimeouts warns (log and metric) about deliveries held for
// ConsumerTimeoutWarn: RabbitMQ cannot extend a delivery's time, and at
// ConsumerTimeout the broker closes the channel, voiding every delivery on
// it. Each delivery is warned about once.
func (s *Source) watchTimeouts() {
	defer s.wg.Done()
	every := min(max(s.v.ConsumerTimeoutWarn/10, 10*time.Millisecond), 30*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.closed:
			return
		case now := <-t.C:
			s.mu.Lock()
			ss := s.cur
			s.mu.Unlock()
			if ss != nil {
				s.warnSlow(ss, now)
			}
		}
	}
}

type slowDelivery struct {
	tag  uint64
	id   string
	held time.Duration
}

func (s *Source) warnSlow(ss *session, now time.Time) {
	var slow []slowDelivery
	ss.mu.Lock()
	// The in-flight list, then the deliveries waiting for Receive (all
	// younger), are in delivery order: stop at the first delivery that is
	// young enough.
	young := false
	inFlight := false // a delivery in the engine's hands just became invalid (see Valid)
	for r := ss.head; r != nil; r = r.next {
		held := now.Sub(r.at)
		if held < s.v.ConsumerTimeoutWarn {
			young = true
			break
		}
		if !r.warned {
			r.warned = true
			inFlight = true
			slow = append(slow, slowDelivery{tag: r.d.DeliveryTag, id: r.d.MessageId, held: held})
		}
	}
	for i := 0; !young && i < len(ss.waiting); i++ {
		w := &ss.waiting[i]
		held := now.Sub(w.at)
		if held < s.v.ConsumerTimeoutWarn {
			break
		}
		if !w.warned {
			w.warned = true
			slow = append(slow, slowDelivery{tag: w.tag, id: w.id, held: held})
		}
	}
	ss.mu.Unlock()
	if inFlight && !s.v.Plain {
		// Held past the warning, they are no longer Valid: the engine
		// hands back those waiting in place now, not when their waits end.
		s.invalid.Invalidated()
	}
	for _, d := range slow {
		s.timeoutWarnings.Add(context.Background(), 1)
		s.log.Warn("rabbitmq: delivery held close to the broker's consumer_timeout; at the timeout the broker closes the channel and redelivers every delivery on it",
			ackwise.LogKeyQueue, s.v.Queue, "delivery_tag", d.tag, "message_id", d.id,
			ackwise.LogKeyDuration, d.held, ackwise.LogKeyTimeout, s.v.ConsumerTimeout)
	}
}
