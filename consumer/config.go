package consumer

import (
	"cmp"
	"fmt"
	"log/slog"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/retry"
)

// Ordering says which messages must be handled one at a time, in order.
type Ordering int

const (
	// OrderKey handles messages with the same Key one at a time in arrival
	// order; different keys run in parallel. Messages without a key are not
	// ordered. It is the default.
	OrderKey Ordering = iota
	// OrderPartition handles messages of one log partition (or one source,
	// where there are no partitions) one at a time.
	OrderPartition
	// OrderNone runs any message on any free worker.
	OrderNone
)

func (o Ordering) String() string {
	switch o {
	case OrderKey:
		return "key"
	case OrderPartition:
		return "partition"
	case OrderNone:
		return "none"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// RetryMode says how a failed message waits for its next attempt.
type RetryMode int

const (
	// RetryAuto follows the adapter's configuration: name tiers in the
	// adapter's URL (or config) and failed messages wait in the broker
	// (retry topics, wait queues); leave them out and they wait in place, in
	// the consumer. That is: through the broker when the source has delay
	// tiers (Capabilities.DelayTiers), even on a source that delivers keys
	// in order, where a retried message then leaves its key's order (use
	// RetryInPlace to keep it); else in place when the source delivers keys
	// in order (Capabilities.Ordered) and Ordering is not OrderNone, so a
	// waiting message holds back its key (invariant 8); else through the
	// broker when it can delay without tiers (Capabilities.Delay: the memory
	// queue); else in place. It is the default.
	RetryAuto RetryMode = iota
	// RetryInPlace keeps the message in flight and runs it again after the
	// delay, from a timer: no worker sleeps, other keys go on, its key waits.
	// The message's lease is extended while it waits, where the broker allows.
	RetryInPlace
	// RetryBroker hands the message back to the broker with the delay (Nack):
	// a visibility timeout, a wait queue, a retry topic. It frees the slot at
	// once but gives up per-key order for that key. The source must have
	// Capabilities.Delay (on Kafka and RabbitMQ: delay tiers named); New
	// fails otherwise.
	RetryBroker
)

func (m RetryMode) String() string {
	switch m {
	case RetryAuto:
		return "auto"
	case RetryInPlace:
		return "in-place"
	case RetryBroker:
		return "broker"
	}
	return fmt.Sprintf("RetryMode(%d)", int(m))
}

// Defaults for zero Config fields.
const (
	DefaultName         = "ackwise"
	DefaultConcurrency  = 4
	DefaultDrainTimeout = 30 * time.Second
	// DefaultInFlightPerWorker sets MaxInFlight to Concurrency times this.
	DefaultInFlightPerWorker = 16
	// DefaultReceiveBatch is the most messages asked for in one Receive.
	DefaultReceiveBatch = 64
)

// Upper bounds of Config fields: the engine allocates a goroutine per
// worker and buffers per in-flight message, so a larger value is a mistake
// (a unit or a shift gone wrong), refused by New rather than tried.
const (
	MaxConcurrency = 1 << 16
	MaxInFlightMax = 1 << 20
)

// Config configures a Consumer. The zero value means the documented
// defaults.
type Config struct {
	// Name identifies the consumer in dead letters (ackwise-dlq-consumer),
	// logs and the inbox. Default DefaultName.
	Name string
	// Version is the consumer's version, for ackwise-dlq-consumer-version.
	// Default empty (header left out).
	Version string

	// Concurrency is the most handlers running at once. Default
	// DefaultConcurrency (4). The engine runs that many workers; when
	// handlers are cheaper than handing a message to another goroutine, the
	// receiving goroutine runs them itself, taking one of the Concurrency
	// places while it does. At most MaxConcurrency.
	Concurrency int
	// MaxInFlight bounds the messages received and not yet settled: running,
	// waiting for their key, or waiting in place for a retry. It must be at
	// least Concurrency and at most MaxInFlightMax. Default Concurrency ×
	// DefaultInFlightPerWorker, at most MaxInFlightMax.
	MaxInFlight int
	// ReceiveBatch is the most messages asked of the source in one Receive.
	// Default DefaultReceiveBatch (64), never more than MaxInFlight.
	ReceiveBatch int
	// Ordering is OrderKey by default.
	Ordering Ordering

	// Retry is the retry policy: attempts and backoff. Default: retry's
	// defaults (5 attempts, 1s doubling up to 10m, jitter 0.5). When retries
	// go through a source with tiered delays (Capabilities.DelayTiers: Kafka
	// retry topics, RabbitMQ wait queues) and Retry sets no schedule (no
	// Tiers, InitialInterval, Multiplier, MaxInterval or Jitter), its Tiers
	// are the source's: a message walks the chain, one tier per retry, the
	// last repeating until MaxAttempts.
	Retry retry.Policy
	// RetryMode is RetryAuto by default.
	RetryMode RetryMode
	// Classifiers map application errors to classes, after the class marks
	// set with ackwise.Permanent/RetryAfter/Discard. Unrecognized errors are
	// transient.
	Classifiers []ackwise.Classifier
	// RetryPanics makes a handler panic transient (retried with backoff).
	// Default false: a panic is permanent and dead-lettered at once — a panic
	// is a bug, and retrying a bug only repeats it.
	RetryPanics bool

	// Inbox is the idempotency middleware (middleware.Inbox). It runs inside
	// the engine's recover and classification and outside Middleware, so the
	// inbox record commits with the handler's effect or not at all.
	Inbox ackwise.Middleware
	// Middleware wraps the handler, the first outermost, inside Inbox.
	Middleware []ackwise.Middleware
	// Breaker, when set, pauses consumption during a dependency outage instead
	// of spending attempts (see Breaker).
	Breaker *Breaker

	// DrainTimeout bounds how long shutdown waits for running handlers before
	// cancelling their context. Default DefaultDrainTimeout (30s); -1 waits
	// without limit.
	DrainTimeout time.Duration
	// Clock is the time source for retry timers, lease heartbeats and dead
	// letter times. Default ackwise.SystemClock.
	Clock ackwise.Clock
	// Logger receives the engine's logs. Default: discard.
	Logger *slog.Logger
	// Observer, when set, is told the outcome of every message, for metrics.
	// It must be fast and safe for concurrent use. Under NewBatch the
	// elapsed time it is told is the run time of the message's batch.
	Observer Observer

	// Batch configures NewBatch's batches; New refuses it set.
	Batch BatchConfig
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = min(c.Concurrency*DefaultInFlightPerWorker, MaxInFlightMax)
	}
	if c.ReceiveBatch == 0 {
		c.ReceiveBatch = DefaultReceiveBatch
	}
	c.ReceiveBatch = min(c.ReceiveBatch, c.MaxInFlight)
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.Clock == nil {
		c.Clock = ackwise.SystemClock
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Retry = c.Retry.WithDefaults()
	return c
}

func (c Config) validate() error {
	switch {
	case c.Concurrency < 0:
		return fmt.Errorf("consumer: Concurrency = %d: must be positive (0 means %d)", c.Concurrency, DefaultConcurrency)
	case c.Concurrency > MaxConcurrency:
		return fmt.Errorf("consumer: Concurrency = %d: at most MaxConcurrency (%d)", c.Concurrency, MaxConcurrency)
	case c.MaxInFlight < 0:
		return fmt.Errorf("consumer: MaxInFlight = %d: must be positive (0 means Concurrency × %d)", c.MaxInFlight, DefaultInFlightPerWorker)
	case c.MaxInFlight > MaxInFlightMax:
		return fmt.Errorf("consumer: MaxInFlight = %d: at most MaxInFlightMax (%d)", c.MaxInFlight, MaxInFlightMax)
	case c.MaxInFlight > 0 && c.MaxInFlight < cmp.Or(c.Concurrency, DefaultConcurrency):
		return fmt.Errorf("consumer: MaxInFlight = %d is below Concurrency = %d: workers would idle", c.MaxInFlight, cmp.Or(c.Concurrency, DefaultConcurrency))
	case c.ReceiveBatch < 0:
		return fmt.Errorf("consumer: ReceiveBatch = %d: must be positive (0 means %d)", c.ReceiveBatch, DefaultReceiveBatch)
	case c.Ordering < OrderKey || c.Ordering > OrderNone:
		return fmt.Errorf("consumer: Ordering = %d: not one of OrderKey, OrderPartition, OrderNone", int(c.Ordering))
	case c.RetryMode < RetryAuto || c.RetryMode > RetryBroker:
		return fmt.Errorf("consumer: RetryMode = %d: not one of RetryAuto, RetryInPlace, RetryBroker", int(c.RetryMode))
	case c.DrainTimeout < -1:
		return fmt.Errorf("consumer: DrainTimeout = %v: must be positive, 0 (default %v) or -1 (no limit)", c.DrainTimeout, DefaultDrainTimeout)
	}
	for i, mw := range c.Middleware {
		if mw == nil {
			return fmt.Errorf("consumer: Middleware[%d] is nil", i)
		}
	}
	if err := c.Retry.Validate(); err != nil {
		return fmt.Errorf("consumer: Retry: %w", err)
	}
	return nil
}
