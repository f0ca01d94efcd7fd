package kafka

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Defaults applied to zero fields of the configs.
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

// ClientConfig is how a client reaches and authenticates to the brokers.
// Each constructor's config embeds it: [SourceConfig], [ShareConfig],
// [SinkConfig] and [TransactConfig]. The zero value of every field but
// Brokers means the documented default.
type ClientConfig struct {
	// Brokers are the seed brokers, "host:port". Required.
	Brokers []string
	// TLS, when non-nil, dials the brokers with TLS.
	TLS *tls.Config
	// SASL, when non-nil, authenticates with this mechanism (see
	// github.com/twmb/franz-go/pkg/sasl/plain and .../scram).
	SASL sasl.Mechanism
	// ClientID is the Kafka client ID. Empty means "ackwise".
	ClientID string
	// Logger receives the adapter's logs and franz-go's. Nil discards them.
	Logger *slog.Logger
	// MeterProvider, when non-nil, gets franz-go's client metrics
	// (connections, bytes and records produced and fetched, per broker and
	// topic: messaging.kafka.*), through franz-go's OpenTelemetry plugin
	// (github.com/twmb/franz-go/plugin/kotel).
	MeterProvider metric.MeterProvider
	// TracerProvider, when non-nil, gets a span per record the client
	// produces ("<topic> publish") and fetches ("<topic> receive"), through
	// the same plugin. Those spans neither read nor write trace headers:
	// writing them would change the headers of retry moves and dead
	// letters, which are kept as they came (the handler's trace comes from
	// ackwise's tracing middleware).
	TracerProvider trace.TracerProvider
	// Options are extra franz-go options applied after the adapter's own;
	// they can override them, except that the constructors refuse, with an
	// error naming them: options turning off idempotent writes or acks=all
	// (records, retry moves and dead letters are produced with both);
	// options turning auto-commit on (kgo.AutoCommitMarks,
	// kgo.GreedyAutoCommit: offsets are committed only for settled records,
	// invariant 2); and, for a [Source], the options of a group's callbacks
	// and commits (kgo.OnPartitionsAssigned, kgo.OnPartitionsRevoked,
	// kgo.OnPartitionsLost, which would replace the source's own, which
	// commit on revocation; kgo.DisableAutoCommit, kgo.AutoCommitCallback).
	// A share group refuses auto-commit options and callbacks itself.
	Options []kgo.Opt

	// optionsFrom names where Options came from in errors, when not the
	// config's own field: "kafka.WithClientOptions" for a URL's opener.
	optionsFrom string
	// urlTLS is the first TLS parameter of the URL the config was read
	// from ("tls", "tls_ca", …), for the opener to refuse a TLS config
	// beside it; "" when none.
	urlTLS string
}

// SourceConfig configures a [Source] (NewSource) and names the topics of
// its chain ([CreateTopics]). The zero value of every field but Brokers,
// Topic and Group means the documented default.
type SourceConfig struct {
	ClientConfig
	// Topic is the topic consumed. Required.
	Topic string
	// Group is the consumer group. Required.
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
	// must stay below the group's rebalance timeout (RebalanceTimeout, or
	// kgo.RebalanceTimeout in Options; 60s by default): NewSource refuses
	// one that does not.
	RevokeTimeout time.Duration
	// PollBatch, when positive, is the most records the source takes from
	// the client in one poll and holds until Receive hands them out
	// (records of partitions revoked meanwhile are dropped). Zero, the
	// default, takes everything the client has fetched: the client then
	// fetches the next batch while these are handled, and the memory is
	// bounded by FetchMaxBytes. A PollBatch smaller than a fetch makes the
	// client wait for the rest of the fetch to be taken before it fetches
	// again.
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

	// SessionTimeout is how long the group coordinator waits for the
	// member's heartbeat before it evicts it and rebalances (franz-go's
	// kgo.SessionTimeout). Zero means franz-go's default (45s).
	SessionTimeout time.Duration
	// RebalanceTimeout is how long the group waits for every member to
	// rejoin in a rebalance (franz-go's kgo.RebalanceTimeout); RevokeTimeout
	// must stay below it. Zero means franz-go's default (60s).
	RebalanceTimeout time.Duration
	// HeartbeatInterval is how often the member heartbeats to the group
	// coordinator (franz-go's kgo.HeartbeatInterval), well below
	// SessionTimeout. Zero means franz-go's default (3s).
	HeartbeatInterval time.Duration

	// testOptions are appended after Options without their check: tests
	// wrap the source's partition callbacks with them.
	testOptions []kgo.Opt
}

// ShareConfig configures a [ShareSource] (NewShareSource). The zero value
// of every field but Brokers, Topic and Group means the documented default.
type ShareConfig struct {
	ClientConfig
	// Topic is the topic consumed. Required.
	Topic string
	// Group is the share group. Required.
	Group string
	// DeadLetterTopic is where DeadLetter produces. Empty means Topic +
	// DefaultDeadLetterSuffix (".dlq").
	DeadLetterTopic string
	// PollBatch is about how many records the broker hands over, and locks
	// for this member, per poll. Zero means DefaultSharePollBatch.
	PollBatch int
	// FetchMaxBytes and FetchMaxPartitionBytes bound the client's fetches,
	// as in SourceConfig. Zero means the client's defaults.
	FetchMaxBytes          int32
	FetchMaxPartitionBytes int32
	// StartOffset is written to the group's share.auto.offset.reset when
	// the source opens: "earliest" (the default) makes a new group start at
	// the beginning of the topic (the broker's default for share groups is
	// latest), "latest" at its end.
	StartOffset string
}

// SinkConfig configures a [Sink] (NewSink). The zero value of every field
// but Brokers and Topic means the documented default.
type SinkConfig struct {
	ClientConfig
	// Topic is the topic written. Required.
	Topic string
}

// groupOpts are the options of the group timeouts that are set.
func (c SourceConfig) groupOpts() []kgo.Opt {
	var opts []kgo.Opt
	if c.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(c.SessionTimeout))
	}
	if c.RebalanceTimeout > 0 {
		opts = append(opts, kgo.RebalanceTimeout(c.RebalanceTimeout))
	}
	if c.HeartbeatInterval > 0 {
		opts = append(opts, kgo.HeartbeatInterval(c.HeartbeatInterval))
	}
	return opts
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

// withDefaults returns c with defaults applied.
func (c ClientConfig) withDefaults() ClientConfig {
	if c.ClientID == "" {
		c.ClientID = "ackwise"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// withDefaults returns c with defaults applied and tiers sorted.
func (c SourceConfig) withDefaults() SourceConfig {
	c.ClientConfig = c.ClientConfig.withDefaults()
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.RevokeTimeout == 0 {
		c.RevokeTimeout = DefaultRevokeTimeout
	}
	c.DeadLetterTopic = deadLetterTopic(c.Topic, c.DeadLetterTopic)
	if c.RetryTopic == nil {
		c.RetryTopic = DefaultRetryTopic
	}
	c.StartOffset = startOffset(c.StartOffset)
	if len(c.RetryTiers) > 0 {
		t := append([]time.Duration(nil), c.RetryTiers...)
		sort.Slice(t, func(i, j int) bool { return t[i] < t[j] })
		c.RetryTiers = t
	}
	return c
}

// withDefaults returns c with defaults applied.
func (c ShareConfig) withDefaults() ShareConfig {
	c.ClientConfig = c.ClientConfig.withDefaults()
	c.DeadLetterTopic = deadLetterTopic(c.Topic, c.DeadLetterTopic)
	c.StartOffset = startOffset(c.StartOffset)
	return c
}

// deadLetterTopic is dlq, or topic's default dead-letter topic.
func deadLetterTopic(topic, dlq string) string {
	if dlq == "" && topic != "" {
		return topic + DefaultDeadLetterSuffix
	}
	return dlq
}

// startOffset is v, or "earliest".
func startOffset(v string) string {
	if v == "" {
		return "earliest"
	}
	return v
}

// names says how a validation error names a field: as a config's
// ("SourceConfig.Group", see fieldsOf) or as a URL's (`URL parameter
// "group"`, see urlNames).
type names func(field string) string

// fieldsOf names the fields of the config type cfg.
func fieldsOf(cfg string) names { return func(f string) string { return cfg + "." + f } }

// optionsName names c.Options in errors, c being embedded in the config
// type cfg ("SourceConfig").
func (c ClientConfig) optionsName(cfg string) string {
	return cmp.Or(c.optionsFrom, cfg+".Options")
}

// validate reports the first bad field of a defaulted ClientConfig, and of
// its config's topic.
func (c ClientConfig) validate(n names, topic string) error {
	if len(c.Brokers) == 0 {
		return fmt.Errorf("kafka: %s is empty: need at least one host:port", n("Brokers"))
	}
	for i, b := range c.Brokers {
		if b == "" || strings.ContainsAny(b, " /,") {
			return fmt.Errorf("kafka: %s[%d] = %q: want host:port", n("Brokers"), i, b)
		}
	}
	return validTopic(n("Topic"), topic)
}

// consumeFields are what a consuming config (SourceConfig, ShareConfig,
// TransactConfig) says about the group and its fetches.
type consumeFields struct {
	n                      names
	client                 ClientConfig
	topic, group, start    string
	pollBatch              int
	fetchMax, fetchMaxPart int32
}

// validate reports the first bad field of defaulted consumeFields.
func (m consumeFields) validate() error {
	if err := m.client.validate(m.n, m.topic); err != nil {
		return err
	}
	if m.group == "" {
		return fmt.Errorf("kafka: %s is empty: a consumer needs a group", m.n("Group"))
	}
	if m.pollBatch < 0 {
		return fmt.Errorf("kafka: %s = %d: must be positive, or 0 for the default", m.n("PollBatch"), m.pollBatch)
	}
	if m.fetchMax < 0 {
		return fmt.Errorf("kafka: %s = %d: must be positive, or 0 for the client's default", m.n("FetchMaxBytes"), m.fetchMax)
	}
	if m.fetchMaxPart < 0 {
		return fmt.Errorf("kafka: %s = %d: must be positive, or 0 for the client's default", m.n("FetchMaxPartitionBytes"), m.fetchMaxPart)
	}
	if m.start != "earliest" && m.start != "latest" {
		return fmt.Errorf("kafka: %s = %q: want \"earliest\" or \"latest\"", m.n("StartOffset"), m.start)
	}
	return nil
}

// opts are the client options of a consumer: the client's, the fetch limits
// and read_committed isolation.
func (m consumeFields) opts() []kgo.Opt {
	opts := m.client.opts()
	if m.fetchMax > 0 {
		opts = append(opts, kgo.FetchMaxBytes(m.fetchMax))
	}
	if m.fetchMaxPart > 0 {
		opts = append(opts, kgo.FetchMaxPartitionBytes(m.fetchMaxPart))
	}
	return append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
}

func (c SourceConfig) consume(n names) consumeFields {
	return consumeFields{n, c.ClientConfig, c.Topic, c.Group, c.StartOffset, c.PollBatch, c.FetchMaxBytes, c.FetchMaxPartitionBytes}
}

func (c ShareConfig) consume() consumeFields {
	return consumeFields{fieldsOf("ShareConfig"), c.ClientConfig, c.Topic, c.Group, c.StartOffset, c.PollBatch, c.FetchMaxBytes, c.FetchMaxPartitionBytes}
}

// validate reports the first bad field of a defaulted config, naming it and
// its value.
func (c SourceConfig) validate() error { return c.check(fieldsOf("SourceConfig")) }

// check is validate with the fields named by n.
func (c SourceConfig) check(n names) error {
	if err := c.consume(n).validate(); err != nil {
		return err
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"CommitInterval", c.CommitInterval}, {"SessionTimeout", c.SessionTimeout}, {"RebalanceTimeout", c.RebalanceTimeout}, {"HeartbeatInterval", c.HeartbeatInterval}} {
		if d.v < 0 {
			return fmt.Errorf("kafka: %s = %v: must not be negative", n(d.field), d.v)
		}
	}
	if c.RevokeTimeout < -1 {
		return fmt.Errorf("kafka: %s = %v: must be positive, 0 (default) or -1 (no wait)", n("RevokeTimeout"), c.RevokeTimeout)
	}
	if c.RebalanceTimeout > 0 && c.RevokeTimeout >= c.RebalanceTimeout {
		return fmt.Errorf("kafka: %s = %v: must be below %s = %v, or a slow handler gets the member evicted", n("RevokeTimeout"), c.RevokeTimeout, n("RebalanceTimeout"), c.RebalanceTimeout)
	}
	return c.validateChain(n)
}

// validate reports the first bad field of a defaulted config, naming it and
// its value.
func (c ShareConfig) validate() error {
	if err := c.consume().validate(); err != nil {
		return err
	}
	_, err := validDeadLetter(fieldsOf("ShareConfig"), c.Topic, c.DeadLetterTopic)
	return err
}

// validDeadLetter checks the dead-letter topic dlq of topic, and returns
// the names taken by the two, for checking further topics against.
func validDeadLetter(n names, topic, dlq string) (map[string]bool, error) {
	if err := validTopic(n("DeadLetterTopic"), dlq); err != nil {
		return nil, err
	}
	if norm(dlq) == norm(topic) {
		return nil, fmt.Errorf("kafka: %s = %q: must differ from %s %q (also in '.' against '_')", n("DeadLetterTopic"), dlq, n("Topic"), topic)
	}
	return map[string]bool{norm(topic): true, norm(dlq): true}, nil
}

// norm is a topic name as Kafka compares names for collisions: a name
// differing from another's only in '.' against '_' is refused (their metric
// names collide).
func norm(t string) string { return strings.ReplaceAll(t, ".", "_") }

// validateChain checks the topics of the chain besides Topic: the
// dead-letter topic and the retry tiers and their topics.
func (c SourceConfig) validateChain(n names) error {
	seen, err := validDeadLetter(n, c.Topic, c.DeadLetterTopic)
	if err != nil {
		return err
	}
	for i, t := range c.RetryTiers {
		if t <= 0 {
			return fmt.Errorf("kafka: %s has %v: tiers must be positive", n("RetryTiers"), t)
		}
		if i > 0 && c.RetryTiers[i-1] == t {
			return fmt.Errorf("kafka: %s has %s twice", n("RetryTiers"), FormatTier(t))
		}
		name := c.RetryTopic(c.Topic, t)
		if err := validTopic(fmt.Sprintf("%s for tier %s", n("RetryTopic"), FormatTier(t)), name); err != nil {
			return err
		}
		if seen[norm(name)] {
			return fmt.Errorf("kafka: %s for tier %s = %q: collides with another topic of the chain (also in '.' against '_')", n("RetryTopic"), FormatTier(t), name)
		}
		seen[norm(name)] = true
	}
	return nil
}

// validTopic applies Kafka's topic name rules to the field named field
// ("SinkConfig.Topic", `URL parameter "dlq"`).
func validTopic(field, t string) error {
	if t == "" {
		return fmt.Errorf("kafka: %s is empty", field)
	}
	if len(t) > 249 || t == "." || t == ".." {
		return fmt.Errorf("kafka: %s = %q: not a valid Kafka topic name", field, t)
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("kafka: %s = %q: Kafka topic names use only [a-zA-Z0-9._-]", field, t)
		}
	}
	return nil
}

// retryTopics returns the retry topic of each tier, in tier order.
func (c SourceConfig) retryTopics() []string {
	out := make([]string, len(c.RetryTiers))
	for i, t := range c.RetryTiers {
		out[i] = c.RetryTopic(c.Topic, t)
	}
	return out
}

// Topics returns every topic of the chain a source with this config uses:
// the topic, its retry topics in tier order, and the dead-letter topic. Use
// it to create them (see [CreateTopics]).
func (c SourceConfig) Topics() []string {
	d := c.withDefaults()
	out := []string{d.Topic}
	out = append(out, d.retryTopics()...)
	return append(out, d.DeadLetterTopic)
}

// opts are the options every client of the adapter starts with; Options
// come after the constructor's own.
func (c ClientConfig) opts() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ClientID(c.ClientID),
		// acks=all with idempotent writes: franz-go's default, stated
		// here; refused in Options that weaken either (weakerProduce).
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.WithLogger(slogAdapter{c.Logger}),
	}
	if c.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(c.TLS))
	}
	if c.SASL != nil {
		opts = append(opts, kgo.SASL(c.SASL))
	}
	var telemetry []kotel.Opt
	if c.MeterProvider != nil {
		telemetry = append(telemetry, kotel.WithMeter(kotel.NewMeter(kotel.MeterProvider(c.MeterProvider))))
	}
	if c.TracerProvider != nil {
		telemetry = append(telemetry, kotel.WithTracer(kotel.NewTracer(kotel.TracerProvider(c.TracerProvider),
			kotel.TracerPropagator(propagation.NewCompositeTextMapPropagator()), // no headers: see TracerProvider
			kotel.ClientID(c.ClientID))))
	}
	if len(telemetry) > 0 {
		opts = append(opts, kgo.WithHooks(kotel.NewKotel(telemetry...).Hooks()...))
	}
	return opts
}

// refuseCommitOptions reports options among opts (named name in errors,
// see ClientConfig.optionsName) that would break invariant 2 of a group consumer:
// auto-commit turned on, and, when owned (a Source), any option of the
// group's partition callbacks or commits, which the source owns: a
// callback would replace the source's own, which commit settled offsets on
// revocation. It reads them from clients made of opts, which never reach a
// broker (their context is cancelled) and are closed at once.
func refuseCommitOptions(name string, opts []kgo.Opt, owned bool) error {
	if len(opts) == 0 {
		return nil
	}
	dead, cancel := context.WithCancel(context.Background())
	cancel()
	probe := func(extra ...kgo.Opt) error {
		cl, err := kgo.NewClient(append(append(slices.Clip(opts), extra...), kgo.WithContext(dead))...)
		if err != nil {
			return err
		}
		defer cl.Close()
		for _, o := range []struct {
			opt  any
			name string
		}{{kgo.AutoCommitMarks, "kgo.AutoCommitMarks"}, {kgo.GreedyAutoCommit, "kgo.GreedyAutoCommit"}} {
			if on, _ := cl.OptValue(o.opt).(bool); on {
				return fmt.Errorf("turn auto-commit on (%s): offsets are committed only for settled records (invariant 2), by the adapter", o.name)
			}
		}
		return nil
	}
	if err := probe(kgo.ConsumerGroup("ackwise-options-check")); err != nil {
		return fmt.Errorf("kafka: %s %w", name, err)
	}
	if !owned {
		return nil
	}
	// Without a group, franz-go refuses the options of a group's callbacks
	// and commits.
	if err := probe(); err != nil {
		return fmt.Errorf("kafka: %s set what the source owns (partition callbacks, which commit settled offsets on revocation; commit settings): %w", name, err)
	}
	return nil
}
