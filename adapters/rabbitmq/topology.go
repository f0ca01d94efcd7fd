package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Queue arguments ackwise sets.
const (
	argQueueType      = "x-queue-type"
	argMessageTTL     = "x-message-ttl"
	argDLX            = "x-dead-letter-exchange"
	argDLRoutingKey   = "x-dead-letter-routing-key"
	argDLStrategy     = "x-dead-letter-strategy"
	argOverflow       = "x-overflow"
	dlStrategyALO     = "at-least-once"
	overflowRejectPub = "reject-publish"
)

// queueSpec is one queue of the topology and the arguments it must have.
type queueSpec struct {
	role string // "work queue", "wait queue", "dead-letter queue"
	name string
	args amqp.Table
	// strict queues are checked for their arguments, not only for existence,
	// even when ackwise does not declare them: a wait queue without its TTL
	// or dead-letter target would hold or drop retries.
	strict bool
}

// topology lists the queues of a source: the work queue, one wait queue per
// tier (x-message-ttl = tier, dead-lettering to the work queue through the
// default exchange), and the dead-letter queue. All are durable and of the
// configured type; quorum queues that dead-letter do so at-least-once, which
// RabbitMQ requires to go with overflow=reject-publish.
func (v validated) topology() []queueSpec {
	if v.Plain {
		return []queueSpec{{role: "queue", name: v.Queue}}
	}
	base := func() amqp.Table {
		t := amqp.Table{argQueueType: string(v.QueueType)}
		if v.QueueType == Quorum {
			t[argDLStrategy] = dlStrategyALO
			t[argOverflow] = overflowRejectPub
		}
		return t
	}
	work := base()
	work[argDLX] = ""
	work[argDLRoutingKey] = v.DeadLetterQueue
	specs := []queueSpec{{role: "work queue", name: v.Queue, args: work}}
	for i, tier := range v.DelayTiers {
		a := base()
		a[argMessageTTL] = int64(tier / time.Millisecond)
		a[argDLX] = ""
		a[argDLRoutingKey] = v.Queue
		specs = append(specs, queueSpec{role: "wait queue", name: v.waitQueues[i], args: a, strict: true})
	}
	dl := amqp.Table{argQueueType: string(v.QueueType)}
	if v.QueueType == Quorum {
		dl[argOverflow] = overflowRejectPub
	}
	specs = append(specs, queueSpec{role: "dead-letter queue", name: v.DeadLetterQueue, args: dl})
	return specs
}

// withChannel runs f on a fresh channel of ac and closes it. A channel
// error (404, 406) closes only that channel.
func withChannel(ac *amqp.Connection, f func(*amqp.Channel) error) error {
	ch, err := ac.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return f(ch)
}

// setupTopology declares (declare) or verifies the topology on ac. Verifying
// checks that every queue exists, and that every wait queue has exactly the
// TTL and dead-letter arguments ackwise expects: a wait queue whose
// dead-letter target is missing or wrong would drop retries silently, so
// ackwise refuses to start instead.
func (v validated) setupTopology(ac *amqp.Connection, declare bool) error {
	for _, q := range v.topology() {
		if !declare {
			err := withChannel(ac, func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclarePassive(q.name, true, false, false, false, nil)
				return err
			})
			if err != nil {
				var ae *amqp.Error
				if errors.As(err, &ae) && ae.Code == amqp.NotFound {
					return fmt.Errorf("rabbitmq: %s %q does not exist: declare the topology first (Config.DeclareTopology, rabbitmq.Declare or declare=true in the URL): %w", q.role, q.name, err)
				}
				return fmt.Errorf("rabbitmq: check %s %q: %w", q.role, q.name, err)
			}
			if !q.strict {
				continue
			}
		}
		// Declaring an existing queue with other arguments fails with
		// PRECONDITION_FAILED, which is how an existing queue's arguments
		// are checked over AMQP.
		err := withChannel(ac, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(q.name, true, false, false, false, q.args)
			return err
		})
		if err != nil {
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
				return fmt.Errorf("rabbitmq: %s %q exists with other arguments than ackwise expects (%s): delete it or declare it with these arguments: %w", q.role, q.name, formatArgs(q.args), err)
			}
			return fmt.Errorf("rabbitmq: declare %s %q: %w", q.role, q.name, err)
		}
	}
	return nil
}

func formatArgs(t amqp.Table) string {
	s := ""
	for _, k := range []string{argQueueType, argMessageTTL, argDLX, argDLRoutingKey, argDLStrategy, argOverflow} {
		if v, ok := t[k]; ok {
			if s != "" {
				s += ", "
			}
			s += fmt.Sprintf("%s=%q", k, fmt.Sprint(v))
		}
	}
	return s
}

// Declare declares the topology of cfg on the broker: the work queue, one
// wait queue per delay tier and the dead-letter queue, durable and of
// cfg.QueueType (see the package doc for their arguments). It is idempotent,
// and fails when a queue exists with other arguments. Call it before
// publishing to a queue no source has declared yet.
func Declare(ctx context.Context, cfg Config) error {
	v, err := cfg.validate()
	if err != nil {
		return err
	}
	ac, err := v.conn.dial(ctx)
	if err != nil {
		return err
	}
	defer ac.Close()
	return v.setupTopology(ac, true)
}
