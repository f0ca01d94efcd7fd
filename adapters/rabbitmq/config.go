package rabbitmq

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/retry"
)

// QueueType is the kind of RabbitMQ queue ackwise consumes from and declares.
type QueueType string

// Queue types.
const (
	// Classic queues are RabbitMQ's original queues. They keep no delivery
	// count, so Message.Attempt comes from the ackwise-attempt header, the
	// x-death counts and the redelivered flag (see the package doc).
	Classic QueueType = "classic"
	// Quorum queues are replicated (Raft) queues. They count deliveries
	// (x-delivery-count), so Message.Attempt survives consumer crashes.
	Quorum QueueType = "quorum"
)

// Defaults applied to zero fields of [Config] and [SinkConfig].
const (
	// DefaultPrefetch is the basic.qos prefetch count: the most unacknowledged
	// deliveries the broker pushes to one source.
	DefaultPrefetch = 128
	// DefaultConsumerTimeout is RabbitMQ's own default consumer_timeout
	// (30 minutes since 3.8.15): a delivery unacknowledged for longer makes
	// the broker close the channel.
	DefaultConsumerTimeout = 30 * time.Minute
	// DefaultHeartbeat is the AMQP heartbeat interval.
	DefaultHeartbeat = 10 * time.Second
	// DefaultConnectionName is advertised to the broker as connection_name
	// (shown by rabbitmqctl list_connections client_properties).
	DefaultConnectionName = "ackwise"
	// DefaultReconnectInitialInterval is the first wait before reconnecting
	// after a connection or channel died.
	DefaultReconnectInitialInterval = 100 * time.Millisecond
	// DefaultReconnectMaxInterval caps the wait between reconnection attempts.
	DefaultReconnectMaxInterval = 10 * time.Second
	// DefaultDialTimeout bounds one TCP (and TLS) connection attempt.
	DefaultDialTimeout = 30 * time.Second
)

// maxHeartbeat is the longest heartbeat AMQP can express (uint16 seconds).
const maxHeartbeat = 65535 * time.Second

// maxTiers bounds the number of wait queues a source declares.
const maxTiers = 32

// TiersFor returns the delay tiers (one wait queue each) that serve retry
// policy p: p.Tiers when set, else the policy's exponential delays without
// jitter for every retry it makes (at most 32 of them), without duplicates.
// A jittered delay is rounded up to the next tier by Nack.
func TiersFor(p retry.Policy) []time.Duration {
	if len(p.Tiers) > 0 {
		t := slices.Clone(p.Tiers)
		slices.Sort(t)
		return slices.Compact(t)
	}
	p.Jitter = retry.NoJitter
	p = p.WithDefaults()
	n := p.MaxAttempts - 1
	if p.MaxAttempts == retry.Unlimited || n > maxTiers {
		n = maxTiers
	}
	var tiers []time.Duration
	for a := 1; a <= n; a++ {
		d := p.Delay(a)
		if len(tiers) > 0 && d <= tiers[len(tiers)-1] {
			if d == p.MaxInterval {
				break // the schedule reached its cap; further tiers repeat it
			}
			continue
		}
		tiers = append(tiers, d)
	}
	if len(tiers) == 0 {
		tiers = []time.Duration{p.InitialInterval}
	}
	return tiers
}

// Config configures a [Source]. The zero value of every field but URL and
// Queue means the documented default.
type Config struct {
	// URL is the broker's AMQP URI, amqp://user:password@host:port/vhost or
	// amqps://… for TLS (the vhost is the path, as in RabbitMQ's URI spec).
	// Required. It never appears in logs or errors with its password, nor
	// where the Config is printed (see [Config.String]).
	URL string
	// TLS configures TLS for amqps URLs; it is an error with an amqp:// URL.
	// Nil means the system roots and the URL's host as server name. It is
	// not modified.
	TLS *tls.Config
	// Queue is the work queue to consume from. Required.
	Queue string
	// QueueType is the type of every queue of the topology. Empty means
	// Classic.
	QueueType QueueType
	// Prefetch is the basic.qos prefetch count, the bound on unacknowledged
	// deliveries. Set it at least as large as the engine's in-flight limit,
	// or workers idle. Zero means DefaultPrefetch.
	Prefetch int
	// DeclareTopology makes the source declare the work queue, the wait
	// queues and the dead-letter queue (durable, of QueueType) before it
	// consumes, and again after every reconnection. Off, the source only
	// verifies that they exist with the arguments ackwise expects and refuses
	// to start otherwise.
	DeclareTopology bool
	// Plain consumes Queue as it is — a dead-letter queue to inspect or
	// redrive, a queue ackwise did not set up: no wait queues and no
	// dead-letter queue are declared or checked, only that Queue exists.
	// Nack and DeadLetter return ErrPlain and Capabilities.Delay is false
	// (the engine retries in place; a message it dead-letters is handed
	// back, see the package doc). It cannot be combined with
	// DeclareTopology, DelayTiers or DeadLetterQueue.
	Plain bool
	// DelayTiers are the redelivery delays, one wait queue per tier, named
	// WaitQueueName(Queue, tier). Nack rounds a delay up to the next tier and
	// cuts it to the largest; the consumer engine's default (RetryAuto)
	// retries through them. Empty means no wait queues: Nack returns
	// ErrNoTiers, Capabilities.Delay is false, and failed messages wait in
	// place, in the consumer (TiersFor(policy) gives tiers that serve a
	// retry policy). Each must be a whole number of milliseconds, at least
	// 1ms.
	DelayTiers []time.Duration
	// DeadLetterQueue is the queue DeadLetter publishes to. Empty means
	// Queue + ".dlq".
	DeadLetterQueue string
	// ConsumerTimeout is the broker's consumer_timeout: a delivery held longer
	// than this without an ack makes the broker close the channel, and every
	// delivery on it is redelivered. Leases cannot be extended on RabbitMQ, so
	// the source warns (log and metric) when a delivery has been held for
	// ConsumerTimeoutWarn, and from then on Valid reports it no longer
	// valid (but on a Plain source): the engine hands it back (nack,
	// requeue) rather than start its handler or try a failed move again. Zero means DefaultConsumerTimeout
	// (the broker's default); -1 turns the warning and the hand-back off.
	ConsumerTimeout time.Duration
	// ConsumerTimeoutWarn is how long a delivery may be held before the
	// warning and the hand-back. Zero means 80% of ConsumerTimeout; it must
	// be zero when ConsumerTimeout is -1.
	ConsumerTimeoutWarn time.Duration
	// Heartbeat is the AMQP heartbeat interval, in whole seconds from 1s to
	// 65535s. Zero means DefaultHeartbeat.
	Heartbeat time.Duration
	// ConnectionName is advertised as the connection_name client property.
	// Empty means DefaultConnectionName.
	ConnectionName string
	// ReconnectInitialInterval and ReconnectMaxInterval shape the exponential
	// backoff (github.com/cenkalti/backoff/v4, with jitter) between
	// reconnection attempts, which go on until Close. Zero means
	// DefaultReconnectInitialInterval and DefaultReconnectMaxInterval.
	ReconnectInitialInterval time.Duration
	ReconnectMaxInterval     time.Duration
	// Logger receives connection events and consumer-timeout warnings. Nil
	// discards.
	Logger *slog.Logger
	// MeterProvider provides the consumer-timeout warning counter
	// (ackwise.rabbitmq.consumer_timeout.warnings). Nil means no metrics.
	MeterProvider metric.MeterProvider
	// TracerProvider provides the spans of the source's moves: a span
	// (SpanNack, SpanDeadLetter) around each copy Nack publishes to a wait
	// queue and DeadLetter to the dead-letter queue, from the publish to
	// the ack of the original, a child of the settle call's context. Nil
	// means no spans.
	TracerProvider trace.TracerProvider
}

// SinkConfig configures a [Sink]. The zero value of every field but URL and
// the destination means the documented default.
type SinkConfig struct {
	// URL is the broker's AMQP URI, as in Config.URL. Required.
	URL string
	// TLS configures TLS for amqps URLs, as in Config.TLS.
	TLS *tls.Config
	// Exchange is the exchange to publish to. Empty means the default
	// exchange, which routes by queue name.
	Exchange string
	// RoutingKey is the routing key of every message. Empty means
	// Message.Key on a named exchange; with the default exchange it is the
	// queue name and required.
	RoutingKey string
	// Heartbeat, ConnectionName, ReconnectInitialInterval,
	// ReconnectMaxInterval and Logger are as in Config.
	Heartbeat                time.Duration
	ConnectionName           string
	ReconnectInitialInterval time.Duration
	ReconnectMaxInterval     time.Duration
	Logger                   *slog.Logger
	// TracerProvider provides a span (SpanPublish) around each Publish
	// call, from the first message out to the last confirm, a child of
	// Publish's context. Nil means no spans.
	TracerProvider trace.TracerProvider
}

// A Config or SinkConfig printed (fmt's verbs, log/slog, encoding/json)
// shows its URL without the password: String, GoString, LogValue and
// MarshalJSON give the fields with the URL as redactedURL gives it. So a
// Config marshalled to JSON does not unmarshal to a working one.

// String formats c as %+v formats its fields, with the URL's password
// replaced (GoString, LogValue and MarshalJSON too), so that a printed or
// logged Config never shows it.
func (c Config) String() string { return fmt.Sprintf("%+v", c.redacted()) }

// GoString formats c as %#v formats its fields.
func (c Config) GoString() string { return goString(c.redacted(), "Config") }

// LogValue is what log/slog logs for c.
func (c Config) LogValue() slog.Value { return slog.AnyValue(c.redacted()) }

// MarshalJSON marshals c's fields.
func (c Config) MarshalJSON() ([]byte, error) { return json.Marshal(c.redacted()) }

// configFields is Config without its methods.
type configFields Config

func (c Config) redacted() configFields {
	f := configFields(c)
	f.URL = redactedURL(c.URL)
	return f
}

// String formats c as %+v formats its fields, with the URL's password
// replaced (GoString, LogValue and MarshalJSON too).
func (c SinkConfig) String() string { return fmt.Sprintf("%+v", c.redacted()) }

// GoString formats c as %#v formats its fields.
func (c SinkConfig) GoString() string { return goString(c.redacted(), "SinkConfig") }

// LogValue is what log/slog logs for c.
func (c SinkConfig) LogValue() slog.Value { return slog.AnyValue(c.redacted()) }

// MarshalJSON marshals c's fields.
func (c SinkConfig) MarshalJSON() ([]byte, error) { return json.Marshal(c.redacted()) }

// sinkConfigFields is SinkConfig without its methods.
type sinkConfigFields SinkConfig

func (c SinkConfig) redacted() sinkConfigFields {
	f := sinkConfigFields(c)
	f.URL = redactedURL(c.URL)
	return f
}

// goString is %#v of fields, a configFields or sinkConfigFields, named as
// the exported type name.
func goString(fields any, name string) string {
	s := fmt.Sprintf("%#v", fields)
	if i := strings.IndexByte(s, '{'); i >= 0 {
		s = "rabbitmq." + name + s[i:]
	}
	return s
}

// redactedURL is raw with its password replaced by "xxxxx", or a
// placeholder when raw cannot be shown safely: a URL that does not parse,
// or holds '@' after its host, may hold a password anywhere.
func redactedURL(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "(malformed URL, not shown)"
	case adapters.MisplacedUserInfo(u):
		return "(URL with '@' after its host, not shown)"
	}
	return u.Redacted()
}

// conn holds what every connection of a source or sink shares.
type conn struct {
	url       string // amqp URI with the password
	redacted  string
	tls       *tls.Config
	heartbeat time.Duration
	name      string
	initial   time.Duration
	max       time.Duration
	log       *slog.Logger
}

func newConn(rawURL string, tlsCfg *tls.Config, heartbeat time.Duration, name string, initial, maxI time.Duration, log *slog.Logger) (conn, error) {
	c := conn{url: rawURL, tls: tlsCfg, heartbeat: heartbeat, name: name, initial: initial, max: maxI, log: log}
	if rawURL == "" {
		return c, fmt.Errorf("rabbitmq: URL is empty: want amqp://user:password@host:port/vhost")
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return c, fmt.Errorf("rabbitmq: URL is malformed (not quoted, it may hold a password)")
	}
	if err := adapters.RefuseMisplacedUserInfo("rabbitmq", u); err != nil {
		return c, err
	}
	c.redacted = u.Redacted()
	uri, err := amqp.ParseURI(rawURL)
	if err != nil {
		return c, fmt.Errorf("rabbitmq: URL %q: %s", c.redacted, redact(err.Error(), u))
	}
	if tlsCfg != nil && uri.Scheme != "amqps" {
		// amqp091-go ignores the TLS config of an amqp:// URL: the
		// connection, credentials included, would go in clear text.
		return c, fmt.Errorf("rabbitmq: TLS is set but URL %q is not amqps://: use amqps:// for TLS, or no TLS config", c.redacted)
	}
	if c.heartbeat == 0 {
		c.heartbeat = DefaultHeartbeat
	}
	if c.heartbeat < time.Second || c.heartbeat > maxHeartbeat {
		// AMQP counts the heartbeat in whole seconds (a uint16); amqp091-go
		// silently replaces a value below 1s with the broker's.
		return c, fmt.Errorf("rabbitmq: Heartbeat = %v: must be in [1s, %v] (0 means %v)", c.heartbeat, maxHeartbeat, DefaultHeartbeat)
	}
	if c.name == "" {
		c.name = DefaultConnectionName
	}
	if c.initial == 0 {
		c.initial = DefaultReconnectInitialInterval
	}
	if c.max == 0 {
		c.max = DefaultReconnectMaxInterval
	}
	switch {
	case c.initial < 0:
		return c, fmt.Errorf("rabbitmq: ReconnectInitialInterval = %v: must be positive", c.initial)
	case c.max < c.initial:
		return c, fmt.Errorf("rabbitmq: ReconnectMaxInterval = %v: must not be below ReconnectInitialInterval (%v)", c.max, c.initial)
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// redact removes u's password from s, for errors that quote the URL.
func redact(s string, u *url.URL) string {
	if u != nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			s = strings.ReplaceAll(s, p, "xxxxx")
		}
	}
	return s
}

// validated is a Config with its defaults applied and checked.
type validated struct {
	Config
	conn       conn
	waitQueues []string
}

func (cfg Config) validate() (validated, error) {
	v := validated{Config: cfg}
	c, err := newConn(cfg.URL, cfg.TLS, cfg.Heartbeat, cfg.ConnectionName, cfg.ReconnectInitialInterval, cfg.ReconnectMaxInterval, cfg.Logger)
	if err != nil {
		return v, err
	}
	v.conn = c
	v.Logger = c.log
	if err := checkQueueName("Queue", cfg.Queue); err != nil {
		return v, err
	}
	switch v.QueueType {
	case "":
		v.QueueType = Classic
	case Classic, Quorum:
	default:
		return v, fmt.Errorf("rabbitmq: QueueType = %q: want %q or %q", cfg.QueueType, Classic, Quorum)
	}
	switch {
	case v.Prefetch == 0:
		v.Prefetch = DefaultPrefetch
	case v.Prefetch < 0 || v.Prefetch > 65535:
		return v, fmt.Errorf("rabbitmq: Prefetch = %d: must be in [1, 65535] (0 means %d)", cfg.Prefetch, DefaultPrefetch)
	}
	if len(v.DelayTiers) > 0 {
		for i, t := range v.DelayTiers {
			if t < time.Millisecond || t%time.Millisecond != 0 {
				return v, fmt.Errorf("rabbitmq: DelayTiers[%d] = %v: must be a whole number of milliseconds, at least 1ms", i, t)
			}
		}
		v.DelayTiers = slices.Clone(v.DelayTiers)
		slices.Sort(v.DelayTiers)
		v.DelayTiers = slices.Compact(v.DelayTiers)
		if len(v.DelayTiers) > maxTiers {
			return v, fmt.Errorf("rabbitmq: DelayTiers has %d tiers: at most %d", len(v.DelayTiers), maxTiers)
		}
	}
	if v.Plain {
		switch {
		case v.DeclareTopology:
			return v, fmt.Errorf("rabbitmq: Plain = true with DeclareTopology = true: a plain source declares nothing; declare the queue yourself")
		case len(cfg.DelayTiers) > 0:
			return v, fmt.Errorf("rabbitmq: Plain = true with DelayTiers = %v: a plain source has no wait queues (Nack returns ErrPlain)", cfg.DelayTiers)
		case cfg.DeadLetterQueue != "":
			return v, fmt.Errorf("rabbitmq: Plain = true with DeadLetterQueue = %q: a plain source has no dead-letter queue (DeadLetter returns ErrPlain)", cfg.DeadLetterQueue)
		}
	}
	if err := v.checkTopologyNames(); err != nil {
		return v, err
	}
	switch {
	case v.ConsumerTimeout == 0:
		v.ConsumerTimeout = DefaultConsumerTimeout
	case v.ConsumerTimeout < -1:
		return v, fmt.Errorf("rabbitmq: ConsumerTimeout = %v: must be positive, 0 (default) or -1 (no warning)", cfg.ConsumerTimeout)
	case v.ConsumerTimeout == -1 && v.ConsumerTimeoutWarn != 0:
		return v, fmt.Errorf("rabbitmq: ConsumerTimeoutWarn = %v with ConsumerTimeout = -1: the warning is off", cfg.ConsumerTimeoutWarn)
	}
	if v.ConsumerTimeout > 0 {
		switch {
		case v.ConsumerTimeoutWarn == 0:
			v.ConsumerTimeoutWarn = v.ConsumerTimeout / 5 * 4
		case v.ConsumerTimeoutWarn < 0 || v.ConsumerTimeoutWarn > v.ConsumerTimeout:
			return v, fmt.Errorf("rabbitmq: ConsumerTimeoutWarn = %v: must be in (0, ConsumerTimeout = %v]", cfg.ConsumerTimeoutWarn, v.ConsumerTimeout)
		}
	}
	return v, nil
}

// checkTopologyNames defaults and checks the names of the dead-letter queue
// and the wait queues, and lists the wait queues. A plain source has
// neither: their names, which it never uses, are not checked (a long
// queue's dead-letter queue, read plain, has a name too long to take
// ".wait.1s").
func (v *validated) checkTopologyNames() error {
	if v.Plain {
		return nil
	}
	if v.DeadLetterQueue == "" {
		v.DeadLetterQueue = v.Queue + ".dlq"
	}
	if err := checkQueueName("DeadLetterQueue", v.DeadLetterQueue); err != nil {
		return err
	}
	if v.DeadLetterQueue == v.Queue {
		return fmt.Errorf("rabbitmq: DeadLetterQueue = %q: must differ from Queue", v.DeadLetterQueue)
	}
	for _, t := range v.DelayTiers {
		name := WaitQueueName(v.Queue, t)
		if err := checkQueueName("DelayTiers", name); err != nil {
			return err
		}
		if name == v.DeadLetterQueue {
			// Dead letters would expire from it back into the work queue.
			return fmt.Errorf("rabbitmq: DeadLetterQueue = %q: is the wait queue of delay tier %v", v.DeadLetterQueue, t)
		}
		v.waitQueues = append(v.waitQueues, name)
	}
	return nil
}

func checkQueueName(field, name string) error {
	if name == "" {
		return fmt.Errorf("rabbitmq: %s is empty", field)
	}
	if why := queueNameProblem(name); why != "" {
		return fmt.Errorf("rabbitmq: %s = %q: %s", field, name, why)
	}
	return nil
}

// queueNameProblem says what makes a non-empty name no queue name, or "".
func queueNameProblem(name string) string {
	switch {
	case len(name) > 255:
		return "longer than 255 bytes"
	case strings.HasPrefix(name, "amq."):
		return "the amq. prefix is reserved by the broker"
	}
	return ""
}

// WaitQueueName is the name of the wait queue of tier on queue:
// "<queue>.wait.<tier>", the tier in its largest whole unit (30s, 5m, 1h,
// 1500ms).
func WaitQueueName(queue string, tier time.Duration) string {
	return queue + ".wait." + formatTier(tier)
}

func formatTier(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	default:
		return fmt.Sprintf("%dms", d/time.Millisecond)
	}
}

func (cfg SinkConfig) validate() (conn, error) {
	c, err := newConn(cfg.URL, cfg.TLS, cfg.Heartbeat, cfg.ConnectionName, cfg.ReconnectInitialInterval, cfg.ReconnectMaxInterval, cfg.Logger)
	if err != nil {
		return c, err
	}
	if cfg.Exchange == "" && cfg.RoutingKey == "" {
		return c, fmt.Errorf("rabbitmq: RoutingKey is empty: the default exchange (Exchange = \"\") routes by queue name, so RoutingKey must name the queue")
	}
	return c, nil
}
