package kafka

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/internal/urlparam"
)

func init() {
	adapters.Register("kafka", adapters.Opener{
		OpenSource: func(ctx context.Context, u *url.URL, o adapters.OpenOptions) (adapters.Source, error) {
			cfg, err := ParseURL(u)
			if err == nil && cfg.Group == "" {
				err = &urlparam.Error{Adapter: "kafka", Reason: "has no group= parameter; a source needs one"}
			}
			if err == nil {
				err = withOpenOptions(&cfg.ClientConfig, o)
			}
			if err != nil {
				return nil, err
			}
			return NewSource(ctx, cfg)
		},
		OpenSink: func(ctx context.Context, u *url.URL, o adapters.OpenOptions) (adapters.Sink, error) {
			cfg, err := ParseSinkURL(u)
			if err == nil {
				err = withOpenOptions(&cfg.ClientConfig, o)
			}
			if err != nil {
				return nil, err
			}
			return NewSink(ctx, cfg)
		},
		SourceParams: urlParams.Only(urlparam.Source),
	})
}

// urlParams are the query parameters of a kafka:// URL, each for a source,
// a sink or both: any other is an error, and so is a source's on a sink URL.
var urlParams = func() *urlparam.Table {
	ps := []urlparam.Param{
		{Name: "group", Side: urlparam.Source, Type: "string", Doc: "the consumer group (required to open a source)"},
		{Name: "tiers", Side: urlparam.Source, Type: "list of durations", Doc: "retry tiers, e.g. `1m,10m`: turns on retry topics (SourceConfig.RetryTiers)"},
		{Name: "retry_prefix", Side: urlparam.Source, Type: "string", Doc: "retry topics are named `<retry_prefix><tier>` instead of `<topic>.retry.<tier>`"},
		{Name: "dlq", Side: urlparam.Source, Type: "string", Doc: "the dead-letter topic (default `<topic>.dlq`)"},
		{Name: "commit_interval", Side: urlparam.Source, Type: "duration", Doc: "SourceConfig.CommitInterval (default 200ms)"},
		{Name: "revoke_timeout", Side: urlparam.Source, Type: "duration or -1", Doc: "SourceConfig.RevokeTimeout (default 10s; -1: do not wait)"},
		{Name: "session_timeout", Side: urlparam.Source, Type: "duration", Doc: "the group session timeout, SourceConfig.SessionTimeout (default 45s)"},
		{Name: "rebalance_timeout", Side: urlparam.Source, Type: "duration", Doc: "the group rebalance timeout, SourceConfig.RebalanceTimeout (default 60s); above revoke_timeout"},
		{Name: "heartbeat_interval", Side: urlparam.Source, Type: "duration", Doc: "the group heartbeat interval, SourceConfig.HeartbeatInterval (default 3s)"},
		{Name: "poll_batch", Side: urlparam.Source, Type: "int", Doc: "SourceConfig.PollBatch (default 0: whole fetches)"},
		{Name: "fetch_max_bytes", Side: urlparam.Source, Type: "int", Doc: "SourceConfig.FetchMaxBytes (default 0: the client's, 50 MiB)"},
		{Name: "fetch_max_partition_bytes", Side: urlparam.Source, Type: "int", Doc: "SourceConfig.FetchMaxPartitionBytes (default 0: the client's, 1 MiB)"},
		{Name: "start", Side: urlparam.Source, Type: "one of earliest, latest", Doc: "where a group with no commit starts (default earliest)"},
		{Name: "client_id", Side: urlparam.Both, Type: "string", Doc: "the Kafka client ID (default ackwise)"},
		{Name: "tls", Side: urlparam.Both, Type: "bool", Doc: "true: dial with TLS (any `tls_*` parameter does too; false beside one is an error)"},
	}
	ps = append(ps, urlparam.TLSParams()...)
	ps = append(ps, urlparam.Param{Name: "sasl", Side: urlparam.Both, Type: "one of plain, scram-sha-256, scram-sha-512",
		Doc: "authenticate with the user and password of the URL (a user needs it)"})
	t := urlparam.NewTable("kafka", ps...)
	t.Schemes = []string{"kafka"}
	t.NeedHost = true
	t.Form = "kafka://host:9092/topic"
	return t
}()

// urlNames name a SourceConfig's fields as the URL gives them, for the
// validation of a parsed URL.
func urlNames(field string) string {
	switch field {
	case "Brokers":
		return "URL brokers"
	case "Topic":
		return "URL topic (the path)"
	}
	if p, ok := urlFields[field]; ok {
		return fmt.Sprintf("URL parameter %q", p)
	}
	return "URL " + field // not settable by URL: its default
}

// urlFields are the URL parameters of SourceConfig's fields.
var urlFields = map[string]string{
	"Group": "group", "RetryTiers": "tiers", "RetryTopic": "retry_prefix", "DeadLetterTopic": "dlq",
	"CommitInterval": "commit_interval", "RevokeTimeout": "revoke_timeout", "SessionTimeout": "session_timeout",
	"RebalanceTimeout": "rebalance_timeout", "HeartbeatInterval": "heartbeat_interval", "PollBatch": "poll_batch",
	"FetchMaxBytes": "fetch_max_bytes", "FetchMaxPartitionBytes": "fetch_max_partition_bytes", "StartOffset": "start",
}

// ParseURL reads a SourceConfig from a kafka:// URL:
//
//	kafka://[user:password@]host:9092[,host2:9092]/topic?group=g&tiers=1m,10m&dlq=orders.dlq
//
// Query parameters (S: a source's, refused on a sink URL; S+S: both):
//   - group (S): the consumer group (required to open a source, not to
//     name the topics of its chain for CreateTopics);
//   - tiers (S): retry tiers, comma-separated Go durations (turns on retry
//     topics);
//   - retry_prefix (S): retry topics are named <retry_prefix><tier> instead
//     of <topic>.retry.<tier>;
//   - dlq (S): the dead-letter topic (default <topic>.dlq);
//   - commit_interval, revoke_timeout (S): Go durations (revoke_timeout=-1:
//     do not wait, as in SourceConfig);
//   - session_timeout, rebalance_timeout, heartbeat_interval (S): the
//     group's timeouts, Go durations (SourceConfig.SessionTimeout,
//     RebalanceTimeout, HeartbeatInterval);
//   - poll_batch, fetch_max_bytes, fetch_max_partition_bytes (S):
//     SourceConfig.PollBatch, FetchMaxBytes and FetchMaxPartitionBytes;
//   - start (S): earliest (default) or latest;
//   - client_id (S+S);
//   - tls (S+S): true to dial with TLS; tls_ca (PEM file of CAs to trust),
//     tls_cert and tls_key (PEM files of a client certificate),
//     tls_server_name, tls_insecure_skip_verify=true (tests only) (S+S): any
//     of these turns TLS on, and is an error beside tls=false; the PEM files
//     must be regular files of at most 1 MiB;
//   - sasl (S+S): plain, scram-sha-256 or scram-sha-512, with the user and
//     password from the URL's user info.
//
// An unknown, repeated or empty parameter is an error, and so are a malformed
// query (a ';' separator, a bad %-escape), a user without sasl, and values
// the source would refuse (a bad topic name, tiers given twice). Errors
// name the URL parameter (never a Go field) and never contain the
// password.
//
// Opened by URL ([adapters.OpenSource], [adapters.OpenSink]), the kafka
// scheme takes these options: [adapters.WithLogger] (ClientConfig.Logger:
// the adapter's logs and franz-go's), [adapters.WithMeterProvider] and
// [adapters.WithTracerProvider] (ClientConfig.MeterProvider and
// TracerProvider: franz-go's metrics and spans, see there),
// [adapters.WithTLSConfig] (ClientConfig.TLS: TLS with that config; the URL
// must then give no tls parameter, not even tls=true: a *tls.Config holds
// all they would set, and rather than pick one, an error names both) and
// [WithClientOptions] (ClientConfig.Options). An adapter option of another
// adapter is refused (adapters.ErrUnsupportedOption).
func ParseURL(u *url.URL) (SourceConfig, error) {
	q, err := parseKafkaURL(u, urlparam.Source)
	if err != nil {
		return SourceConfig{}, err
	}
	cfg := SourceConfig{ClientConfig: clientFromURL(q)}
	cfg.Topic = topicOf(u)
	q.String(&cfg.Group, "group")
	q.String(&cfg.DeadLetterTopic, "dlq")
	q.Durations(&cfg.RetryTiers, "tiers", 1, urlparam.MaxDuration)
	var prefix string
	if q.String(&prefix, "retry_prefix") {
		cfg.RetryTopic = func(_ string, tier time.Duration) string { return prefix + FormatTier(tier) }
	}
	q.Duration(&cfg.CommitInterval, "commit_interval", 0, urlparam.MaxDuration)
	q.Duration(&cfg.RevokeTimeout, "revoke_timeout", -1, urlparam.MaxDuration)
	q.Duration(&cfg.SessionTimeout, "session_timeout", 0, urlparam.MaxDuration)
	q.Duration(&cfg.RebalanceTimeout, "rebalance_timeout", 0, urlparam.MaxDuration)
	q.Duration(&cfg.HeartbeatInterval, "heartbeat_interval", 0, urlparam.MaxDuration)
	urlparam.Int(q, &cfg.PollBatch, "poll_batch", 0, 1<<31-1)
	urlparam.Int(q, &cfg.FetchMaxBytes, "fetch_max_bytes", 0, 1<<31-1)
	urlparam.Int(q, &cfg.FetchMaxPartitionBytes, "fetch_max_partition_bytes", 0, 1<<31-1)
	urlparam.Enum(q, &cfg.StartOffset, "start", "earliest", "latest")
	if err := q.Err(); err != nil {
		return SourceConfig{}, err
	}
	// The group is required to open a source (the opener requires
	// group=), not to name a chain of topics (CreateTopics).
	v := cfg.withDefaults()
	v.Group = cmp.Or(v.Group, "unchecked")
	if err := v.check(urlNames); err != nil {
		return SourceConfig{}, badURL{err}
	}
	return cfg, nil
}

// ParseSinkURL is ParseURL for a sink ([adapters.OpenSink] uses it): it
// takes only the brokers, the topic, client_id, tls* and sasl; a source's
// parameter is an error naming it, rather than ignored by NewSink.
func ParseSinkURL(u *url.URL) (SinkConfig, error) {
	q, err := parseKafkaURL(u, urlparam.Sink)
	if err != nil {
		return SinkConfig{}, err
	}
	cfg := SinkConfig{ClientConfig: clientFromURL(q), Topic: topicOf(u)}
	if err := q.Err(); err != nil {
		return SinkConfig{}, err
	}
	if err := cfg.ClientConfig.validate(urlNames, cfg.Topic); err != nil {
		return SinkConfig{}, badURL{err}
	}
	return cfg, nil
}

// parseKafkaURL reads u's query for side, once the URL as a whole is a
// kafka URL with a topic.
func parseKafkaURL(u *url.URL, side urlparam.Side) (*urlparam.Query, error) {
	q, err := urlParams.Parse(u, side)
	if err != nil {
		return nil, err
	}
	if strings.Contains(u.Path, "@") {
		// A topic cannot hold '@' (not even as %40): a password cut
		// short, most likely. Do not echo it.
		return nil, &urlparam.Error{Adapter: "kafka", Err: adapters.ErrMisplacedUserInfo}
	}
	if topicOf(u) == "" {
		return nil, &urlparam.Error{Adapter: "kafka", Reason: fmt.Sprintf("%s has no topic in the path (want %s)", adapters.RedactURL(u), urlParams.Form)}
	}
	return q, nil
}

// badURL is the error of a config read from a URL that its validation
// refused: the text names the URL parameters (see urlNames), and it matches
// urlparam.ErrParam as the parser's errors do.
type badURL struct{ error }

func (e badURL) Is(target error) bool { return target == urlparam.ErrParam }

func (e badURL) Unwrap() error { return e.error }

func topicOf(u *url.URL) string { return strings.TrimPrefix(u.Path, "/") }

// clientFromURL reads the ClientConfig of q's URL: brokers, client_id, TLS
// and SASL. An error is kept in q.
func clientFromURL(q *urlparam.Query) ClientConfig {
	u := q.URL()
	c := ClientConfig{Brokers: strings.Split(u.Host, ",")}
	q.String(&c.ClientID, "client_id")
	c.urlTLS = q.First(append([]string{"tls"}, urlparam.TLSParamNames...)...)
	var on bool
	if q.Bool(&on, "tls") && !on {
		if p := q.First(urlparam.TLSParamNames...); p != "" {
			q.Fail(q.Misplaced(p, "is a TLS setting, and tls = false turns TLS off"))
		}
	}
	c.TLS = q.TLS()
	if on && c.TLS == nil && q.Err() == nil {
		c.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	var mech string
	if !q.String(&mech, "sasl") {
		if u.User != nil {
			q.Fail(q.Errorf("", "%s has a user but no sasl= parameter (plain, scram-sha-256 or scram-sha-512)", adapters.RedactURL(u)))
		}
		return c
	}
	user := u.User.Username()
	pass, hasPass := u.User.Password()
	if user == "" || !hasPass {
		q.Fail(q.Errorf("sasl", "needs a user and a password in the URL (kafka://user:password@host/...)"))
		return c
	}
	switch strings.ToLower(mech) {
	case "plain":
		c.SASL = plain.Auth{User: user, Pass: pass}.AsMechanism()
	case "scram-sha-256":
		c.SASL = scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()
	case "scram-sha-512":
		c.SASL = scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()
	default:
		q.Fail(q.Errorf("sasl", "want plain, scram-sha-256 or scram-sha-512"))
	}
	return c
}

// withOpenOptions applies the options of a URL opening to c, the config
// read from the URL. It refuses an adapter option of another adapter, and a
// TLS config beside the URL's own TLS parameters.
func withOpenOptions(c *ClientConfig, o adapters.OpenOptions) error {
	if err := o.CheckAdapterOptions("kafka", clientOptionsKey{}); err != nil {
		return err
	}
	if o.TLS != nil {
		if c.urlTLS != "" {
			return &urlparam.Error{Adapter: "kafka", Param: c.urlTLS,
				Reason: "is given with adapters.WithTLSConfig: give the TLS settings in one place (a *tls.Config holds all the URL's would set)"}
		}
		c.TLS = o.TLS
	}
	if o.Logger != nil {
		c.Logger = o.Logger
	}
	c.MeterProvider = o.MeterProvider
	c.TracerProvider = o.TracerProvider
	if v, ok := o.AdapterOption(clientOptionsKey{}); ok {
		c.Options, c.optionsFrom = v.([]kgo.Opt), "kafka.WithClientOptions"
	}
	return nil
}

// clientOptionsKey is the key of WithClientOptions's adapter option.
type clientOptionsKey struct{}

// WithClientOptions gives a source or sink opened by a kafka:// URL extra
// franz-go options (ClientConfig.Options), applied after the adapter's own:
// the session and rebalance timeouts of kgo have URL parameters too
// (session_timeout, rebalance_timeout), which these override. Options
// that turn auto-commit on, replace a source's partition callbacks, or turn
// off idempotent writes or acks=all are refused when the source or sink
// opens, as in ClientConfig.Options. A later WithClientOptions replaces an
// earlier one.
func WithClientOptions(opts ...kgo.Opt) adapters.OpenOption {
	return adapters.WithAdapterOption(clientOptionsKey{}, append([]kgo.Opt(nil), opts...))
}
