package adaptertest

import (
	"context"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// Harness connects the suite to one adapter.
type Harness struct {
	// Open creates a fresh destination (a queue, topic or subscription with a
	// unique name) and returns a fixture on it. It registers its own cleanup
	// with t.Cleanup and fails t when the broker cannot be reached.
	Open func(t testing.TB, cfg FixtureConfig) Fixture
	// Timeout bounds every wait of the suite for the broker (a delivery, a
	// dead letter, a consumer's drain). Zero means DefaultTimeout.
	Timeout time.Duration
}

// FixtureConfig is what a test case asks of its destination.
type FixtureConfig struct {
	// Lease is the lease (visibility timeout) deliveries should get, kept
	// short so that crash cases see redelivery quickly. Zero means the
	// adapter's choice. Adapters without leases ignore it.
	Lease time.Duration
	// Partitions is the number of partitions a log should have; zero means 1.
	Partitions int
	// MaxAttempts is the broker-side delivery limit where the broker enforces
	// one (an SQS redrive policy, a Pub/Sub dead-letter policy); zero means
	// none. The engine enforces its own limit regardless.
	MaxAttempts int
	// DelayTiers are the redelivery delays a source with tiered delays (wait
	// queues, retry topics) should be set up with.
	DelayTiers []time.Duration
}

// Fixture is one destination and the means to use it.
type Fixture struct {
	// Sink publishes to the destination.
	Sink adapters.Sink
	// NewSource opens a new consumer on the destination: a new member of the
	// same consumer group on a log, a new consumer of the same queue or
	// subscription elsewhere. Opening another one after closing the first is
	// how the suite models a consumer restart.
	NewSource func(t testing.TB) adapters.Source
	// DeadLetters returns the dead letters on the destination's dead-letter
	// destination so far, in the order the broker holds them.
	DeadLetters func(ctx context.Context, t testing.TB) []*ackwise.Message
	// Refuse, when set, makes the broker refuse msg for good (a message over
	// the broker's size limit, say) while it takes the other messages of the
	// same Publish call: it changes msg (its payload, headers) or the
	// destination, and registers any cleanup with t.Cleanup. Nil when the
	// adapter cannot make its broker refuse one message alone; the case
	// that needs it then skips.
	Refuse func(t testing.TB, msg *ackwise.Message)
	// Invalidate, when set, makes deliveries src holds stop being Valid
	// through an event the source tells of (Extensions.Invalidator): a
	// Kafka partition revoked, a RabbitMQ connection closed by the broker,
	// a memory log partition moved to another member. It returns once it
	// caused the event, whether or not src has learnt of it yet. Nil means
	// the suite closes src, an event every such source tells of.
	Invalidate func(t testing.TB, src adapters.Source)
}
