package gcppubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ackwise/ackwise/retry"
)

// Defaults of a source's Config.
const (
	DefaultMaxOutstandingMessages = 100
	DefaultMaxExtension           = 60 * time.Minute
	// MaxStreams bounds Config.Streams.
	MaxStreams = 64
)

// Config configures a Source on one subscription.
type Config struct {
	// Project is the Google Cloud project the subscription belongs to.
	Project string
	// Subscription is the subscription's ID within Project.
	Subscription string
	// DeadLetterTopic picks who dead-letters (see the package doc's "Dead
	// letters"). Set, a topic ID in Project or a full name
	// "projects/P/topics/T": ackwise-managed, DeadLetter publishes there
	// with the envelope, then acks. Empty: broker-managed, the
	// subscription's DeadLetterPolicy forwards a message after its
	// MaxDeliveryAttempts, and DeadLetter fails (errors.ErrUnsupported) so
	// that the engine hands the message back for Pub/Sub to count; with no
	// DeadLetterPolicy either, a poison message comes back for ever (a
	// warning says so), which is what the dlq tools want of a dead-letter
	// subscription.
	DeadLetterTopic string
	// Retry is the consumer's retry policy (consumer.Config.Retry), which
	// NewSource checks the subscription against: its MaxAttempts against
	// the DeadLetterPolicy's MaxDeliveryAttempts (a mismatch is refused),
	// its delays against the RetryPolicy (a warning), its worst hold in
	// place against MaxExtension. The zero value means retry's defaults,
	// as for the consumer. The source itself retries nothing.
	Retry retry.Policy
	// HandlerTimeout is the consumer's handler timeout
	// (middleware.Timeout), if any: a MaxExtension below it is refused,
	// and a zero MaxExtension becomes long enough for every attempt in
	// place (MaxAttempts × HandlerTimeout plus the retry delays), at least
	// DefaultMaxExtension. Zero: no timeout known.
	HandlerTimeout time.Duration
	// Endpoint is the Pub/Sub API endpoint (host:port), reached with TLS
	// and the default credentials; empty: Google's global endpoint.
	Endpoint string
	// Emulator is an emulator's address (host:port), reached in plaintext
	// without credentials, as the Google client does for
	// PUBSUB_EMULATOR_HOST. Not with Endpoint.
	Emulator string
	// MaxOutstandingMessages is the client's flow control: the most
	// messages received and not yet settled (acked, nacked, released or
	// dead-lettered). Zero means DefaultMaxOutstandingMessages. The
	// engine's own bound (consumer MaxInFlight) applies on top of it.
	MaxOutstandingMessages int
	// Streams is the number of streaming-pull streams the client opens
	// (ReceiveSettings.NumGoroutines); each carries a bounded throughput
	// (Pub/Sub: about 10 MB/s), so a busy subscription needs several. The
	// flow control (MaxOutstandingMessages) is shared by all of them. Zero
	// means 1; at most MaxStreams.
	Streams int
	// MaxExtension is the longest the client keeps extending a delivery's
	// ack deadline; past it Pub/Sub may deliver the message again. Keep it
	// above the consumer's handler timeout (plus its retries in place):
	// a delivery held longer is no longer Valid, and its Ack fails with
	// adapters.ErrReceiptInvalid after a warning. Zero means
	// DefaultMaxExtension, or more with HandlerTimeout set (see there).
	MaxExtension time.Duration
	// AckDeadline is the ack deadline the client asks for a delivery on
	// receipt and at each extension (ReceiveSettings.
	// MaxDurationPerAckExtension), in [10s, 600s]: how soon Pub/Sub delivers
	// again a message the client lost track of (one in transit when the
	// consumer stopped, or whose consumer crashed). Zero means the client's
	// own choice: 60s at first, then the 99th percentile of its ack times.
	AckDeadline time.Duration
	// Logger receives warnings (a delivery held past MaxExtension, a
	// failed exactly-once ack, a retry policy or MaxExtension that does
	// not fit Retry, no dead-letter destination); nil discards them, as
	// the other adapters do. It is not given to the Google client, whose
	// debug logs hold message data.
	Logger *slog.Logger
	// ClientOptions are extra Google client options, applied after the
	// adapter's own (credentials, a quota project, gRPC dial options).
	ClientOptions []option.ClientOption
}

// SinkConfig configures a Sink on one topic.
type SinkConfig struct {
	// Project is the Google Cloud project the topic belongs to.
	Project string
	// Topic is the topic's ID within Project.
	Topic string
	// Endpoint and Emulator are as in Config.
	Endpoint, Emulator string
	// Publish tunes the client's batching (DelayThreshold,
	// CountThreshold, ByteThreshold, Timeout, flow control); the zero
	// value means pubsub.DefaultPublishSettings.
	Publish *pubsub.PublishSettings
	// Logger receives a warning when ordering keys were resumed after a
	// failure; nil discards it. It is not given to the Google client.
	Logger *slog.Logger
	// ClientOptions are as in Config.
	ClientOptions []option.ClientOption
}

// newClient opens a Google client on project: at endpoint, or at the
// emulator, or where the environment says (PUBSUB_EMULATOR_HOST, which the
// client reads itself), with the default credentials unless an emulator.
//
// The adapter's logger is not given to the Google client: its debug logs
// hold request and response bodies, message data included.
func newClient(ctx context.Context, project, endpoint, emulator string, extra []option.ClientOption) (*pubsub.Client, error) {
	var opts []option.ClientOption
	switch {
	case emulator != "":
		opts = append(opts,
			option.WithEndpoint(emulator),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
			option.WithoutAuthentication(),
			option.WithTelemetryDisabled())
	case endpoint != "":
		opts = append(opts, option.WithEndpoint(endpoint))
	}
	opts = append(opts, extra...)
	c, err := pubsub.NewClient(ctx, project, opts...)
	if err != nil {
		// The client's errors name no credentials; they may name a
		// credentials file, which is not a secret.
		return nil, fmt.Errorf("gcppubsub: client for project %q: %w", project, err)
	}
	return c, nil
}

func (c *Config) validate() error {
	switch {
	case c.Project == "":
		return errors.New("gcppubsub: Config.Project is empty")
	case c.Subscription == "":
		return errors.New("gcppubsub: Config.Subscription is empty")
	case c.Endpoint != "" && c.Emulator != "":
		return errors.New("gcppubsub: Config.Endpoint and Config.Emulator are both set")
	case c.MaxOutstandingMessages < 0:
		return fmt.Errorf("gcppubsub: Config.MaxOutstandingMessages %d is negative", c.MaxOutstandingMessages)
	case c.AckDeadline != 0 && (c.AckDeadline < 10*time.Second || c.AckDeadline > 600*time.Second):
		return fmt.Errorf("gcppubsub: Config.AckDeadline %v is not in [10s, 600s]", c.AckDeadline)
	case c.MaxExtension < 0:
		return fmt.Errorf("gcppubsub: Config.MaxExtension %v is negative", c.MaxExtension)
	case c.Streams < 0 || c.Streams > MaxStreams:
		return fmt.Errorf("gcppubsub: Config.Streams %d is not in [0, %d]", c.Streams, MaxStreams)
	case c.HandlerTimeout < 0:
		return fmt.Errorf("gcppubsub: Config.HandlerTimeout %v is negative", c.HandlerTimeout)
	case c.MaxExtension != 0 && c.MaxExtension < c.HandlerTimeout:
		return fmt.Errorf("gcppubsub: Config.MaxExtension %v (max_extension=) is below Config.HandlerTimeout %v (handler_timeout=): the client would stop extending a delivery while its handler may still run, and Pub/Sub deliver it again; raise MaxExtension, or leave it 0", c.MaxExtension, c.HandlerTimeout)
	}
	if err := c.Retry.Validate(); err != nil {
		return fmt.Errorf("gcppubsub: Config.Retry: %w", err)
	}
	if c.DeadLetterTopic != "" {
		if _, _, err := topicName(c.Project, c.DeadLetterTopic); err != nil {
			return fmt.Errorf("gcppubsub: Config.DeadLetterTopic %q: %v", c.DeadLetterTopic, err)
		}
	}
	if c.MaxOutstandingMessages == 0 {
		c.MaxOutstandingMessages = DefaultMaxOutstandingMessages
	}
	if c.Streams == 0 {
		c.Streams = 1
	}
	if c.MaxExtension == 0 {
		c.MaxExtension = max(DefaultMaxExtension, c.holdInPlace())
	}
	return nil
}

// holdInPlace is the longest the consumer may hold a delivery when it
// retries in place: every attempt's HandlerTimeout and the longest delays
// between them (jitter included); 0 without a HandlerTimeout or with
// unlimited attempts (no bound).
func (c *Config) holdInPlace() time.Duration {
	p := c.Retry.WithDefaults()
	if c.HandlerTimeout == 0 || p.MaxAttempts == retry.Unlimited {
		return 0
	}
	n := min(p.MaxAttempts, 1<<16)
	hold := c.HandlerTimeout * time.Duration(n)
	jitter := p.Jitter
	p.Jitter = retry.NoJitter
	for a := 1; a < n; a++ {
		d := p.Delay(a)
		if len(p.Tiers) == 0 && jitter != retry.NoJitter {
			// Jitter spreads a delay up to (1+Jitter) times, mirrored
			// below MaxInterval.
			d = min(time.Duration(float64(d)*(1+jitter)), p.MaxInterval)
		}
		hold += d
	}
	return hold
}
