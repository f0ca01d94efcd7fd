package kafka

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
)

// Defaults applied to zero fields of [Config].
const (
	// DefaultCommitInterval is the shortest time between two periodic
	// commits of settled offsets.
	DefaultCommitInterval = 200 * time.Millisecond
	// DefaultRevokeTimeout bounds how long a revocation waits for running
	// handlers of the revoked partitions to settle before it commits.
	DefaultRevokeTimeout = 10 * time.Second
	// DefaultDeadLetterSuffix is appended to the topic to name the
	// dead-letter topic.
	DefaultDeadLetterSuffix = ".dlq"
)

// Config configures a [Source] and a [Sink]. The zero value of every field
// but Brokers and Topic (and Group, for a source) means the documented
// default.
type Config struct {
	// Brokers are the seed brokers, "host:port". Required.
	Brokers []string
	// Topic is the topic consumed by a source or written by a sink.
	// Required.
	Topic string
	// Group is the consumer group of a source. Required for NewSource;
	// ignored by NewSink.
	Group string

	// RetryTiers turns on non-blocking retry topics, one per tier (for
	// example 1m, 10m): Nack moves a record to the topic of the smallest tier
	// at least as long as the asked delay. Empty (the default) means blocking
	// retries in place by the engine. Tiers must be positive and distinct;
	// they are sorted.
	RetryTiers []time.Duration
	// RetryTopic names the retry topic of a tier. Nil means
	// [DefaultRetryTopic] ("<topic>.retry.<tier>"). Names must be distinct
	// and differ from Topic and DeadLetterTopic. Groups consuming the same
	// topic may share its retry topics: each handles only the records it
	// moved there (HeaderRetryGroup) and settles the others unseen. Naming
	// them apart per group (retry_prefix in a URL) saves reading those.
	RetryTopic func(topic string, tier time.Duration) string
	// DeadLetterTopic is where DeadLetter produces. Empty means Topic +
	// DefaultDeadLetterSuffix (".dlq").
	DeadLetterTopic string

	// CommitInterval is the shortest time between two commits of settled
	// offsets while records are being settled; a commit also happens on
	// revocation and on Close. Zero means DefaultCommitInterval (200ms). It
	// bounds how much settled work a crash repeats.
	CommitInterval time.Duration
	// RevokeTimeout bounds how long a revocation waits for handlers running
	// on the revoked partitions to settle before committing and releasing
	// them. Zero means DefaultRevokeTimeout (10s); -1 means do not wait. It
	// must stay below the group's rebalance timeout (franz-go default 60s,
	// kgo.RebalanceTimeout in Options): NewSource refuses one that does not.
	RevokeTimeout time.Duration
	// PollBatch, when positive, is the most records the source takes from
	// the client in one poll and holds until Receive hands them out
	// (records of partitions revoked meanwhile are dropped). Zero, the
	// default, takes everything the client has fetched: the client then
	// fetches the next batch while these are handled, and the memory is
	// bounded by FetchMaxBytes. A PollBatch smaller than a fetch makes the
	// client wait for the rest of the fetch to be taken before it fetches
	// again. For a share source (NewShareSource) it is about how many
	// records the broker hands over, and locks, per poll:
	// DefaultSharePollBatch when zero.
	PollBatch int
	// FetchMaxBytes is the most bytes the client fetches from a broker in
	// one request (franz-go's FetchMaxBytes): with the fetch being handled
	// and the one read ahead, it bounds the memory of records held by the
	// source, per broker, at about three times this, in bytes as fetched
	// (compressed batches take their uncompressed size in memory). A
	// message whose handler runs keeps its fetch alive too (docs/kafka.md,
	// Memory). Zero means the client's default (50 MiB).
	FetchMaxBytes int32
	// FetchMaxPartitionBytes is the most bytes the client fetches from one
	// partition in one request (franz-go's FetchMaxPartitionBytes). Smaller
	// fetches stay in the processor's cache between decoding and handling:
	// at 256 KiB the benchmarks here needed a quarter less CPU per record
	// than at 1 MiB, at the cost of more requests (mind the round trip on
	// distant brokers). Zero means the client's default (1 MiB).
	FetchMaxPartitionBytes int32
	// StartOffset is where a group with no committed offset starts on the
	// topic: "earliest" (the default) or "latest". Retry topics always
	// start at their beginning: they hold only retries this group moved
	// there, which "latest" would skip.
	StartOffset string

	// TLS, when non-nil, dials the brokers with TLS.
	TLS *tls.Config
	// SASL, when non-nil, authenticates with this mechanism (see
	// github.com/twmb/franz-go/pkg/sasl/plain and .../scram).
	SASL sasl.Mechanism
	// ClientID is the Kafka client ID. Empty means "ackwise".
	ClientID string
	// Logger receives the adapter's logs. Nil discards them.
	Logger *slog.Logger
	// Options are extra franz-go options applied after the adapter's own;
	// they can override them (at the caller's risk: turning auto-commit back
	// on breaks invariant 2), except that Options turning off idempotent
	// writes or acks=all are refused (by NewSink and by the sources, whose
	// retry moves and dead letters are produced with both).
	Options []kgo.Opt
}

// DefaultRetryTopic names a retry topic "<topic>.retry.<tier>", the tier
// written compactly: orders.retry.30s, orders.retry.1m, orders.retry.1h30m,
// orders.retry.500ms.
func DefaultRetryTopic(topic string, tier time.Duration) string {
	return topic + ".retry." + FormatTier(tier)
}

// FormatTier writes d compactly: 1m rather than Go's 1m0s, 1h30m rather than
// 1h30m0s, 1m30s, 500ms.
func FormatTier(d time.Duration) string {
	if d <= 0 || d%time.Second != 0 {
		if d%time.Millisecond == 0 && d > 0 {
			return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
		}
		return d.String()
	}
	var b strings.Builder
	h := d / time.Hour
	m := (d % time.Hour) / time.Minute
	s := (d % time.Minute) / time.Second
	if h > 0 {
		b.WriteString(strconv.FormatInt(int64(h), 10) + "h")
	}
	if m > 0 {
		b.WriteString(strconv.FormatInt(int64(m), 10) + "m")
	}
	if s > 0 {
		b.WriteString(strconv.FormatInt(int64(s), 10) + "s")
	}
	return b.String()
}

// withDefaults returns c with defaults applied and tiers sorted.
func (c Config) withDefaults() Config {
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.RevokeTimeout == 0 {
		c.RevokeTimeout = DefaultRevokeTimeout
	}
	if c.DeadLetterTopic == "" && c.Topic != "" {
		c.DeadLetterTopic = c.Topic + DefaultDeadLetterSuffix
	}
	if c.RetryTopic == nil {
		c.RetryTopic = DefaultRetryTopic
	}
	if c.ClientID == "" {
		c.ClientID = "ackwise"
	}
	if c.StartOffset == "" {
		c.StartOffset = "earliest"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if len(c.RetryTiers) > 0 {
		t := append([]time.Duration(nil), c.RetryTiers...)
		sort.Slice(t, func(i, j int) bool { return t[i] < t[j] })
		c.RetryTiers = t
	}
	return c
}

// validate reports the first bad field of a defaulted config, naming it and
// its value.
func (c Config) validate(source bool) error {
	if len(c.Brokers) == 0 {
		return fmt.Errorf("kafka: Config.Brokers is empty: need at least one host:port")
	}
	for i, b := range c.Brokers {
		if b == "" || strings.ContainsAny(b, " /,") {
			return fmt.Errorf("kafka: Config.Brokers[%d] = %q: want host:port", i, b)
		}
	}
	if err := validTopic("Topic", c.Topic); err != nil {
		return err
	}
	if !source {
		return nil
	}
	if c.Group == "" {
		return fmt.Errorf("kafka: Config.Group is empty: a source needs a consumer group")
	}
	if c.CommitInterval < 0 {
		return fmt.Errorf("kafka: Config.CommitInterval = %v: must not be negative", c.CommitInterval)
	}
	if c.RevokeTimeout < -1 {
		return fmt.Errorf("kafka: Config.RevokeTimeout = %v: must be positive, 0 (default) or -1 (no wait)", c.RevokeTimeout)
	}
	if c.PollBatch < 0 {
		return fmt.Errorf("kafka: Config.PollBatch = %d: must be positive, or 0 to take whole fetches", c.PollBatch)
	}
	if c.FetchMaxBytes < 0 {
		return fmt.Errorf("kafka: Config.FetchMaxBytes = %d: must be positive, or 0 for the client's default", c.FetchMaxBytes)
	}
	if c.FetchMaxPartitionBytes < 0 {
		return fmt.Errorf("kafka: Config.FetchMaxPartitionBytes = %d: must be positive, or 0 for the client's default", c.FetchMaxPartitionBytes)
	}
	if c.StartOffset != "earliest" && c.StartOffset != "latest" {
		return fmt.Errorf("kafka: Config.StartOffset = %q: want \"earliest\" or \"latest\"", c.StartOffset)
	}
	return c.validateChain()
}

// validateChain checks the topics of the chain besides Topic: the
// dead-letter topic and the retry tiers and their topics.
func (c Config) validateChain() error {
	if err := validTopic("DeadLetterTopic", c.DeadLetterTopic); err != nil {
		return err
	}
	// Kafka refuses a topic whose name differs from another's only in '.'
	// against '_' (their metric names collide): compare names that way.
	norm := func(t string) string { return strings.ReplaceAll(t, ".", "_") }
	if norm(c.DeadLetterTopic) == norm(c.Topic) {
		return fmt.Errorf("kafka: Config.DeadLetterTopic = %q: must differ from Topic %q (also in '.' against '_')", c.DeadLetterTopic, c.Topic)
	}
	seen := map[string]bool{norm(c.Topic): true, norm(c.DeadLetterTopic): true}
	for i, t := range c.RetryTiers {
		if t <= 0 {
			return fmt.Errorf("kafka: Config.RetryTiers has %v: tiers must be positive", t)
		}
		if i > 0 && c.RetryTiers[i-1] == t {
			return fmt.Errorf("kafka: Config.RetryTiers has %v twice", t)
		}
		name := c.RetryTopic(c.Topic, t)
		if err := validTopic(fmt.Sprintf("RetryTopic(%q, %v)", c.Topic, t), name); err != nil {
			return err
		}
		if seen[norm(name)] {
			return fmt.Errorf("kafka: Config.RetryTopic(%q, %v) = %q: collides with another topic of the chain (also in '.' against '_')", c.Topic, t, name)
		}
		seen[norm(name)] = true
	}
	return nil
}

// validTopic applies Kafka's topic name rules.
func validTopic(field, t string) error {
	if t == "" {
		return fmt.Errorf("kafka: Config.%s is empty", field)
	}
	if len(t) > 249 || t == "." || t == ".." {
		return fmt.Errorf("kafka: Config.%s = %q: not a valid Kafka topic name", field, t)
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("kafka: Config.%s = %q: Kafka topic names use only [a-zA-Z0-9._-]", field, t)
		}
	}
	return nil
}

// retryTopics returns the retry topic of each tier, in tier order.
func (c Config) retryTopics() []string {
	out := make([]string, len(c.RetryTiers))
	for i, t := range c.RetryTiers {
		out[i] = c.RetryTopic(c.Topic, t)
	}
	return out
}

// Topics returns every topic of the chain a source with this config uses:
// the topic, its retry topics in tier order, and the dead-letter topic. Use
// it to create them (see [CreateTopics]).
func (c Config) Topics() []string {
	d := c.withDefaults()
	out := []string{d.Topic}
	out = append(out, d.retryTopics()...)
	return append(out, d.DeadLetterTopic)
}

// clientOpts are the options shared by sources and sinks.
func (c Config) clientOpts() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ClientID(c.ClientID),
		// acks=all with idempotent writes: franz-go's default, stated
		// here; NewSink refuses Options that weaken either.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.WithLogger(slogAdapter{c.Logger}),
	}
	if c.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(c.TLS))
	}
	if c.SASL != nil {
		opts = append(opts, kgo.SASL(c.SASL))
	}
	if c.FetchMaxBytes > 0 {
		opts = append(opts, kgo.FetchMaxBytes(c.FetchMaxBytes))
	}
	if c.FetchMaxPartitionBytes > 0 {
		opts = append(opts, kgo.FetchMaxPartitionBytes(c.FetchMaxPartitionBytes))
	}
	return opts
}
