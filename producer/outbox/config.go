package outbox

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/ackwise/ackwise/producer"
	"github.com/ackwise/ackwise/retry"
)

// Defaults for zero Config fields.
const (
	DefaultBatchSize      = 100
	DefaultWorkers        = 1
	DefaultLease          = 30 * time.Second
	DefaultPollInterval   = time.Second
	DefaultRetention      = 24 * time.Hour
	DefaultPruneInterval  = time.Minute
	DefaultPruneBatch     = 5000
	DefaultDrainTimeout   = 10 * time.Second
	DefaultRowRetryFirst  = time.Second
	DefaultRowRetryMax    = time.Minute
	maxErrorText          = 1000
	bookkeepingTimeout    = 10 * time.Second
	statsTimeout          = 5 * time.Second
	minLeaseOverPublish   = 2
	defaultPublishDivisor = 2
)

// Config configures a [Relay]. The zero value means the documented
// defaults.
type Config struct {
	// Owner names this relay in the claims it writes (column claimed_by).
	// Default: host name, process ID and a random suffix. Two relays
	// must not share one.
	Owner string
	// BatchSize is the most rows one claim takes (one per key) and one
	// Publish call sends. Default DefaultBatchSize (100).
	BatchSize int
	// Workers is how many claim-publish-mark loops the relay runs at once;
	// each holds its own batch, of keys no other holds. They claim one at a
	// time and publish and mark in parallel. Default DefaultWorkers (1).
	Workers int
	// Lease is how long a claim holds its rows: a relay that dies with
	// rows claimed leaves them to be claimed again (and published again,
	// with the same event IDs) once it runs out. Default DefaultLease (30s).
	Lease time.Duration
	// PublishTimeout bounds one Publish call (with the publisher's own
	// retries); it must be at most half of Lease, so that a claim does not
	// run out while its rows are being published. Default Lease/2.
	PublishTimeout time.Duration
	// PollInterval is how long an idle relay waits before it looks for rows
	// again when no notification woke it. With a store that notifies
	// (PostgreSQL's LISTEN/NOTIFY) it only bounds the delay of a missed
	// notification; with one that does not (SQLite) it is the relay's
	// latency. Default DefaultPollInterval (1s).
	PollInterval time.Duration
	// Publish configures the publisher the relay publishes through: its
	// in-process retries of the messages that failed, with their event IDs
	// unchanged. Its NewID is never used (every row has its event ID).
	Publish producer.Config
	// RowRetry says how long a row whose publish failed (after the
	// publisher's own retries) waits before it is claimed again; its key
	// waits with it. Zero InitialInterval means DefaultRowRetryFirst (1s),
	// zero MaxInterval DefaultRowRetryMax (1m), and zero MaxAttempts
	// retry.Unlimited: a broker outage must not lose rows. A positive
	// MaxAttempts parks a row after that many failed claims. Tiers are
	// allowed.
	RowRetry retry.Policy
	// Retention is how long a sent row is kept before the relay prunes
	// it. Default DefaultRetention (24h); -1 never prunes. Parked rows are
	// never pruned.
	Retention time.Duration
	// PruneInterval is how often the relay prunes. Default
	// DefaultPruneInterval (1m).
	PruneInterval time.Duration
	// DrainTimeout is how long Run, once its ctx is done, lets the batches
	// in flight finish publishing; rows still unconfirmed then are
	// released unmarked (published again later, with the same event IDs).
	// Default DefaultDrainTimeout (10s).
	DrainTimeout time.Duration
	// Logger receives the relay's errors (a failed claim, a parked row).
	// Default: discard.
	Logger *slog.Logger
	// MeterProvider records the relay's metrics (see [NewRelay]). Default:
	// none.
	MeterProvider metric.MeterProvider
}

// withDefaults applies the defaults and validates; an error names the
// field, its value and the rule.
func (c Config) withDefaults() (Config, error) {
	if c.Owner == "" {
		c.Owner = defaultOwner()
	}
	if c.BatchSize < 0 || c.Workers < 0 || c.Lease < 0 || c.PublishTimeout < 0 || c.PollInterval < 0 ||
		c.PruneInterval < 0 || c.DrainTimeout < 0 {
		return c, fmt.Errorf("outbox: Config has a negative field (BatchSize %d, Workers %d, Lease %v, PublishTimeout %v, PollInterval %v, PruneInterval %v, DrainTimeout %v): zero means the default",
			c.BatchSize, c.Workers, c.Lease, c.PublishTimeout, c.PollInterval, c.PruneInterval, c.DrainTimeout)
	}
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, c.Lease/defaultPublishDivisor)
	if c.PublishTimeout*minLeaseOverPublish > c.Lease {
		return c, fmt.Errorf("outbox: Config.PublishTimeout = %v: must be at most half of Lease (%v), or a claim could run out while its rows are published", c.PublishTimeout, c.Lease)
	}
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	switch {
	case c.Retention == 0:
		c.Retention = DefaultRetention
	case c.Retention < -1:
		return c, fmt.Errorf("outbox: Config.Retention = %v: must be positive, 0 (default %v) or -1 (never prune)", c.Retention, DefaultRetention)
	}
	c.PruneInterval = cmp.Or(c.PruneInterval, DefaultPruneInterval)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, DefaultDrainTimeout)
	c.RowRetry.InitialInterval = cmp.Or(c.RowRetry.InitialInterval, DefaultRowRetryFirst)
	if c.RowRetry.MaxInterval == 0 {
		c.RowRetry.MaxInterval = max(DefaultRowRetryMax, c.RowRetry.InitialInterval)
	}
	if c.RowRetry.MaxAttempts == 0 {
		c.RowRetry.MaxAttempts = retry.Unlimited
	}
	if err := c.RowRetry.Validate(); err != nil {
		return c, fmt.Errorf("outbox: Config.RowRetry: %w", err)
	}
	c.RowRetry = c.RowRetry.WithDefaults()
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

func defaultOwner() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
