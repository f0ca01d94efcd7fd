package gcppubsub

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"google.golang.org/api/option"

	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/internal/urlparam"
)

func init() {
	adapters.Register("gcppubsub", adapters.Opener{
		OpenSource: func(ctx context.Context, u *url.URL, o adapters.OpenOptions) (adapters.Source, error) {
			cfg, err := ConfigFromURL(u)
			if err != nil {
				return nil, err
			}
			if cfg.ClientOptions, err = withOptions(o); err != nil {
				return nil, err
			}
			cfg.Logger = o.Logger
			return NewSource(ctx, cfg)
		},
		OpenSink: func(ctx context.Context, u *url.URL, o adapters.OpenOptions) (adapters.Sink, error) {
			cfg, err := SinkConfigFromURL(u)
			if err != nil {
				return nil, err
			}
			if cfg.ClientOptions, err = withOptions(o); err != nil {
				return nil, err
			}
			cfg.Logger = o.Logger
			return NewSink(ctx, cfg)
		},
		// A subscription URL is not a topic URL, so a worker's source URL is
		// no redrive target as it is; the parameters are dropped all the same
		// from a topic URL a source's parameters were copied onto.
		SourceParams: params.Only(urlparam.Source),
	})
}

// The URL parameters: the table of sides, types and meanings that the
// package doc, docs/pubsub.md and the URL errors follow.
var params = func() *urlparam.Table {
	src, both := urlparam.Source, urlparam.Both
	t := urlparam.NewTable("gcppubsub",
		urlparam.Param{Name: "endpoint", Side: both, Type: "host:port", Doc: "Pub/Sub API endpoint (a regional one, say), with TLS and the default credentials"},
		urlparam.Param{Name: "emulator", Side: both, Type: "host:port", Doc: "an emulator's address: plaintext, no credentials, as PUBSUB_EMULATOR_HOST"},
		urlparam.Param{Name: "dead_letter_topic", Side: src, Type: "string", Doc: "ackwise-managed dead letters: the topic ackwise dead-letters to, a topic ID in the URL's project or projects/P/topics/T (default: none, broker-managed by the subscription's dead-letter policy)"},
		urlparam.Param{Name: "max_attempts", Side: src, Type: "int ≥ 1, or -1", Doc: "the consumer's max attempts (retry.Policy.MaxAttempts), checked against the subscription's dead-letter policy (default 5, retry's; -1: unlimited)"},
		urlparam.Param{Name: "handler_timeout", Side: src, Type: "duration", Doc: "the consumer's handler timeout: max_extension must not be below it, and defaults to cover every attempt in place (default: none)"},
		urlparam.Param{Name: "max_outstanding", Side: src, Type: "int ≥ 1", Doc: "flow control: most messages received and not yet settled (default 100)"},
		urlparam.Param{Name: "streams", Side: src, Type: "int in [1, 64]", Doc: "streaming-pull streams the client opens, each of bounded throughput (default 1)"},
		urlparam.Param{Name: "ack_deadline", Side: src, Type: "duration in [10s, 600s]", Doc: "ack deadline the client asks per extension: how soon a delivery lost by a stopped consumer comes back (default: the client's, 60s at first)"},
		urlparam.Param{Name: "max_extension", Side: src, Type: "duration", Doc: "longest the client extends a delivery's ack deadline (default 60m, or longer to cover handler_timeout's attempts); not below handler_timeout"},
	)
	t.Schemes = []string{"gcppubsub"}
	t.NeedHost = true
	t.Form = "gcppubsub://projects/<project>/subscriptions/<subscription> (source) or gcppubsub://projects/<project>/topics/<topic> (sink)"
	return t
}()

// ConfigFromURL builds a source Config from a URL of the form
//
//	gcppubsub://projects/<project>/subscriptions/<subscription>?dead_letter_topic=<topic>
//
// (gocloud.dev's form). The parameters are listed in the package doc, each
// for a source, a sink or both. An unknown, repeated or empty parameter is
// an error, and so are a parameter for sinks only, a bad value and a
// malformed query; every such error matches adapters.ErrBadURL and names
// the URL parameter. A URL with user info is refused: credentials come from
// the default chain (Application Default Credentials), never from the URL.
func ConfigFromURL(u *url.URL) (Config, error) {
	q, project, sub, err := parseURL(u, urlparam.Source)
	if err != nil {
		return Config{}, err
	}
	cfg := Config{Project: project, Subscription: sub}
	q.String(&cfg.Endpoint, "endpoint")
	q.String(&cfg.Emulator, "emulator")
	if q.String(&cfg.DeadLetterTopic, "dead_letter_topic") {
		if _, _, err := topicName(project, cfg.DeadLetterTopic); err != nil {
			q.Fail(q.Errorf("dead_letter_topic", "%v", err))
		}
	}
	urlparam.Int(q, &cfg.MaxOutstandingMessages, "max_outstanding", 1, 1<<31-1)
	urlparam.Int(q, &cfg.Streams, "streams", 1, MaxStreams)
	if q.Duration(&cfg.AckDeadline, "ack_deadline", 10*time.Second, 600*time.Second) && cfg.AckDeadline%time.Second != 0 {
		q.Fail(q.Errorf("ack_deadline", "is not a whole number of seconds"))
	}
	q.Duration(&cfg.MaxExtension, "max_extension", time.Second, urlparam.MaxDuration)
	q.Duration(&cfg.HandlerTimeout, "handler_timeout", 1, urlparam.MaxDuration)
	if urlparam.Int(q, &cfg.Retry.MaxAttempts, "max_attempts", -1, 1<<31-1) && cfg.Retry.MaxAttempts == 0 {
		q.Fail(q.Errorf("max_attempts", "want at least 1, or -1 (unlimited)"))
	}
	if err := q.Err(); err != nil {
		return Config{}, err
	}
	if err := checkEndpoint(q, cfg.Endpoint, cfg.Emulator); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// SinkConfigFromURL builds a SinkConfig from a URL of the form
//
//	gcppubsub://projects/<project>/topics/<topic>
//
// as ConfigFromURL reads a source's; the source parameters are errors.
func SinkConfigFromURL(u *url.URL) (SinkConfig, error) {
	q, project, topic, err := parseURL(u, urlparam.Sink)
	if err != nil {
		return SinkConfig{}, err
	}
	cfg := SinkConfig{Project: project, Topic: topic}
	q.String(&cfg.Endpoint, "endpoint")
	q.String(&cfg.Emulator, "emulator")
	if err := q.Err(); err != nil {
		return SinkConfig{}, err
	}
	if err := checkEndpoint(q, cfg.Endpoint, cfg.Emulator); err != nil {
		return SinkConfig{}, err
	}
	return cfg, nil
}

// parseURL reads the query for side and the path: projects/P/subscriptions/S
// for a source, projects/P/topics/T for a sink.
func parseURL(u *url.URL, side urlparam.Side) (*urlparam.Query, string, string, error) {
	q, err := params.Parse(u, side)
	if err != nil {
		return nil, "", "", err
	}
	if u.User != nil {
		return nil, "", "", q.Errorf("", "has user info: credentials come from the default chain (Application Default Credentials), never from the URL")
	}
	kind, want := "subscriptions", "gcppubsub://projects/<project>/subscriptions/<subscription>"
	if side == urlparam.Sink {
		kind, want = "topics", "gcppubsub://projects/<project>/topics/<topic>"
	}
	parts := strings.Split(u.Host+u.Path, "/")
	if len(parts) != 4 || parts[0] != "projects" || parts[2] != kind || parts[1] == "" || parts[3] == "" {
		return nil, "", "", q.Errorf("", "%s is not of the form %s", adapters.RedactURL(u), want)
	}
	if u.Fragment != "" || u.Port() != "" {
		return nil, "", "", q.Errorf("", "%s is not of the form %s", adapters.RedactURL(u), want)
	}
	return q, parts[1], parts[3], nil
}

// checkEndpoint refuses endpoint= beside emulator=, and beside
// PUBSUB_EMULATOR_HOST, whose plaintext, credential-less connection the
// Google client would mix with the endpoint.
func checkEndpoint(q *urlparam.Query, endpoint, emulator string) error {
	switch {
	case endpoint != "" && emulator != "":
		return q.Misplaced("endpoint", "cannot go with emulator=: an emulator is an endpoint without TLS or credentials")
	case endpoint != "" && os.Getenv(EmulatorHostEnv) != "":
		return q.Misplaced("endpoint", "cannot go with the environment's "+EmulatorHostEnv+" (the Google client would connect to it without TLS or credentials): unset it, or use emulator=")
	}
	return nil
}

// EmulatorHostEnv is the environment variable the Google client reads: when
// set (host:port), it connects there, in plaintext and without credentials.
// A config's Emulator does the same for one client.
const EmulatorHostEnv = "PUBSUB_EMULATOR_HOST"

// topicName returns the full name of topic ("projects/P/topics/T"), given
// as an ID in project or as a full name.
func topicName(project, topic string) (string, string, error) {
	parts := strings.Split(topic, "/")
	switch {
	case len(parts) == 1 && topic != "":
		return "projects/" + project + "/topics/" + topic, topic, nil
	case len(parts) == 4 && parts[0] == "projects" && parts[2] == "topics" && parts[1] != "" && parts[3] != "":
		return topic, parts[3], nil
	}
	return "", "", fmt.Errorf("want a topic ID or projects/<project>/topics/<topic>")
}

type clientOptionsKey struct{}

// WithClientOptions gives a source or sink opened by a gcppubsub:// URL
// extra Google client options (option.ClientOption: credentials from a
// file or token source, a quota project, gRPC dial options), applied after
// the adapter's own (endpoint=, emulator=, the logger). A later
// WithClientOptions replaces an earlier one.
func WithClientOptions(opts ...option.ClientOption) adapters.OpenOption {
	return adapters.WithAdapterOption(clientOptionsKey{}, append([]option.ClientOption(nil), opts...))
}

// withOptions returns the client options given with WithClientOptions, and
// refuses the options the adapter cannot use: another adapter's option, a
// meter or tracer provider (the adapter has no metrics or spans of its
// own), a TLS config (the Google client sets up its own
// TLS; give gRPC dial options with WithClientOptions).
func withOptions(o adapters.OpenOptions) ([]option.ClientOption, error) {
	if err := o.CheckAdapterOptions("gcppubsub", clientOptionsKey{}); err != nil {
		return nil, err
	}
	switch {
	case o.MeterProvider != nil:
		return nil, adapters.UnsupportedOption("gcppubsub", "WithMeterProvider", "the adapter has no metrics of its own, and the Google client reports to OpenTelemetry's global meter provider")
	case o.TracerProvider != nil:
		return nil, adapters.UnsupportedOption("gcppubsub", "WithTracerProvider", "the adapter has no spans of its own, and the Google client's tracing (not turned on) would use OpenTelemetry's global tracer provider")
	case o.TLS != nil:
		return nil, adapters.UnsupportedOption("gcppubsub", "WithTLSConfig", "the Google client sets up TLS itself; pass gRPC dial options with gcppubsub.WithClientOptions")
	}
	v, _ := o.AdapterOption(clientOptionsKey{})
	opts, _ := v.([]option.ClientOption)
	return opts, nil
}
