package sqs

import (
	"context"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/internal/urlparam"
)

// Scheme is the URL scheme of SQS queues (gocloud.dev's).
const Scheme = "awssqs"

func init() {
	adapters.Register(Scheme, adapters.Opener{
		OpenSource: func(ctx context.Context, u *url.URL, o adapters.OpenOptions) (adapters.Source, error) {
			cfg, err := ConfigFromURL(u)
			if err != nil {
				return nil, err
			}
			if err := withOptions(&cfg.Connection, o, urlparam.Source); err != nil {
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
			if o.Logger != nil {
				return nil, adapters.UnsupportedOption("sqs", "WithLogger", "a sink logs nothing (each Publish reports per message)")
			}
			if err := withOptions(&cfg.Connection, o, urlparam.Sink); err != nil {
				return nil, err
			}
			return NewSink(ctx, cfg)
		},
		SourceParams: params.Only(urlparam.Source),
	})
}

// The URL parameters: the table of sides, types and meanings that the
// package doc, docs/sqs.md and the URL errors follow.
var params = func() *urlparam.Table {
	src, both := urlparam.Source, urlparam.Both
	t := urlparam.NewTable("sqs",
		urlparam.Param{Name: "region", Side: both, Type: "string", Doc: "AWS region (default: REGION of a host sqs.REGION.amazonaws.com, else the AWS chain's)"},
		urlparam.Param{Name: "endpoint", Side: both, Type: "http(s) URL", Doc: "SQS endpoint to call instead of AWS's, for emulators (http://127.0.0.1:9324)"},
		urlparam.Param{Name: "dlq", Side: src, Type: "queue name or URL", Doc: "dead-letter queue: a name beside the queue, or an https:// queue URL (default: none; DeadLetter fails)"},
		urlparam.Param{Name: "dlq_mode", Side: src, Type: "one of ackwise, broker", Doc: "who moves dead letters: ackwise (default) sends them to `dlq` with the envelope; broker leaves them to the queue's RedrivePolicy, as they are"},
		urlparam.Param{Name: "max_attempts", Side: src, Type: "int", Doc: "the consumer's retry max attempts, 1 to 1000 (default 5): with dlq_mode=broker the queue's maxReceiveCount must equal it"},
		urlparam.Param{Name: "wait", Side: src, Type: "duration or -1", Doc: "long-poll wait, whole seconds from 1s to 20s (default 20s; -1: short polling)"},
		urlparam.Param{Name: "visibility", Side: src, Type: "duration", Doc: "visibility timeout (lease) each receive asks for, whole seconds from 1s to 12h (default: the queue's)"},
		urlparam.Param{Name: "ack_linger", Side: src, Type: "duration or -1", Doc: "how long an ack waits to share a DeleteMessageBatch call (default 5ms; -1: no wait)"},
		urlparam.Param{Name: "pollers", Side: src, Type: "int", Doc: "ReceiveMessage calls under way at once, 1 to 64, within the consumer's in-flight window (default 2)"},
	)
	t.Schemes = []string{Scheme}
	t.NeedHost = true
	t.Form = "awssqs://sqs.REGION.amazonaws.com/ACCOUNT/QUEUE"
	return t
}()

// awsConfigKey is the key of WithAWSConfig's adapter option.
type awsConfigKey struct{}

// WithAWSConfig gives a source or sink opened by an awssqs:// URL the AWS
// configuration to use (credentials, retryer, HTTP client) instead of the
// default chain's (Connection.AWS); the URL's region and endpoint still
// apply over it.
func WithAWSConfig(cfg aws.Config) adapters.OpenOption {
	return adapters.WithAdapterOption(awsConfigKey{}, cfg)
}

// withOptions applies the opener's options to c and refuses those the
// adapter cannot use: telemetry providers (it has no metrics or traces
// yet) and another adapter's options.
func withOptions(c *Connection, o adapters.OpenOptions, side urlparam.Side) error {
	if err := o.CheckAdapterOptions("sqs", awsConfigKey{}); err != nil {
		return err
	}
	if o.MeterProvider != nil {
		return adapters.UnsupportedOption("sqs", "WithMeterProvider", "the sqs adapter has no metrics of its own yet")
	}
	if o.TracerProvider != nil {
		return adapters.UnsupportedOption("sqs", "WithTracerProvider", "the sqs adapter makes no spans of its own yet")
	}
	if v, ok := o.AdapterOption(awsConfigKey{}); ok {
		cfg := v.(aws.Config)
		c.AWS = &cfg
	}
	c.TLS = o.TLS
	return nil
}

// ConfigFromURL builds a source Config from a URL of the form
//
//	awssqs://sqs.us-east-2.amazonaws.com/123456789012/orders?region=us-east-2&dlq=orders-dlq&wait=20s
//
// following gocloud.dev: the queue URL is https:// with the URL's host
// and path. The parameters are listed in the package doc, each for a
// source, a sink or both. An unknown, repeated or empty parameter is an
// error, and so are a parameter for sinks only, a bad value, a malformed
// query and user info (credentials come from the AWS chain); every such
// error matches adapters.ErrBadURL and names the URL parameter.
func ConfigFromURL(u *url.URL) (Config, error) {
	q, conn, queueURL, err := parseURL(u, urlparam.Source)
	if err != nil {
		return Config{}, err
	}
	c := Config{QueueURL: queueURL, Connection: conn}
	var dlq string
	if q.String(&dlq, "dlq") {
		c.DeadLetterQueueURL = resolveDLQ(q, queueURL, dlq)
	}
	if urlparam.Enum(q, &c.DeadLetters, "dlq_mode", DeadLetterAckwise, DeadLetterBroker) && c.DeadLetters == DeadLetterBroker && c.DeadLetterQueueURL != "" {
		q.Fail(q.Errorf("dlq_mode", "broker takes no dlq= parameter: the queue's RedrivePolicy names the dead-letter queue"))
	}
	urlparam.Int(q, &c.MaxAttempts, "max_attempts", 1, maxReceiveCountLimit)
	if q.Duration(&c.WaitTime, "wait", -1, DefaultWaitTime) && c.WaitTime != -1 && (c.WaitTime < time.Second || c.WaitTime%time.Second != 0) {
		q.Fail(q.Errorf("wait", "want whole seconds from 1s to 20s, or -1"))
	}
	if q.Duration(&c.VisibilityTimeout, "visibility", time.Second, MaxVisibility) && c.VisibilityTimeout%time.Second != 0 {
		q.Fail(q.Errorf("visibility", "want whole seconds"))
	}
	if q.Duration(&c.AckLinger, "ack_linger", -1, time.Minute) && c.AckLinger == 0 {
		c.AckLinger = -1
	}
	urlparam.Int(q, &c.Pollers, "pollers", 1, MaxPollers)
	return c, q.Err()
}

// SinkConfigFromURL builds a SinkConfig from a URL like ConfigFromURL's;
// the source parameters (dlq, dlq_mode, max_attempts, wait, visibility,
// ack_linger, pollers) are errors.
func SinkConfigFromURL(u *url.URL) (SinkConfig, error) {
	_, conn, queueURL, err := parseURL(u, urlparam.Sink)
	if err != nil {
		return SinkConfig{}, err
	}
	return SinkConfig{QueueURL: queueURL, Connection: conn}, nil
}

func parseURL(u *url.URL, side urlparam.Side) (*urlparam.Query, Connection, string, error) {
	var conn Connection
	q, err := params.Parse(u, side)
	if err != nil {
		return nil, conn, "", err
	}
	if u.User != nil {
		return nil, conn, "", q.Errorf("", "holds user info (not shown): credentials come from the AWS chain (environment, shared files, roles), never from the URL")
	}
	if u.Fragment != "" || u.Opaque != "" {
		return nil, conn, "", q.Errorf("", "%s has a fragment or an opaque part: want %s", adapters.RedactURL(u), params.Form)
	}
	name := path.Base(u.Path)
	if u.Path == "" || strings.HasSuffix(u.Path, "/") || name == "/" || name == "." {
		return nil, conn, "", q.Errorf("", "%s names no queue: want %s", adapters.RedactURL(u), params.Form)
	}
	if why := queueNameProblem(name); why != "" {
		return nil, conn, "", q.Errorf("", "path names queue %q: %s", name, why)
	}
	queueURL := (&url.URL{Scheme: "https", Host: u.Host, Path: u.Path}).String()
	if checkQueueURL("", queueURL) != nil {
		// A host url.Parse took that an https URL cannot have ("::").
		return nil, conn, "", q.Errorf("", "host %q cannot be a queue URL's (want %s)", u.Host, params.Form)
	}
	q.String(&conn.Region, "region")
	if q.String(&conn.Endpoint, "endpoint") {
		if why := endpointProblem(conn.Endpoint); why != "" {
			// Not quoted: it may hold user info.
			q.Fail(q.Misplaced("endpoint", why))
		}
	}
	return q, conn, queueURL, q.Err()
}

// resolveDLQ returns the URL of the dead-letter queue v names: an http(s)
// queue URL as it is, or a queue name beside queueURL.
func resolveDLQ(q *urlparam.Query, queueURL, v string) string {
	if strings.Contains(v, "://") {
		if err := checkQueueURL("dlq", v); err != nil {
			// Not quoted: it may hold user info.
			q.Fail(q.Misplaced("dlq", "is not a queue name nor an https:// queue URL without user info"))
			return ""
		}
		if why := queueNameProblem(queueName(v)); why != "" {
			q.Fail(q.Errorf("dlq", "%s", why))
		}
		if v == queueURL {
			q.Fail(q.Errorf("dlq", "is the queue itself"))
		}
		return v
	}
	if why := queueNameProblem(v); why != "" {
		q.Fail(q.Errorf("dlq", "%s", why))
		return ""
	}
	u, _ := url.Parse(queueURL)
	u.Path = path.Join(path.Dir(u.Path), v)
	if u.String() == queueURL {
		q.Fail(q.Errorf("dlq", "is the queue itself"))
	}
	return u.String()
}

// queueNameProblem says why SQS would refuse name as a queue name (1 to 80
// of letters, digits, '-' and '_', ".fifo" at the end of a FIFO queue's
// counted in), or "".
func queueNameProblem(name string) string {
	base := strings.TrimSuffix(name, ".fifo")
	if len(name) > 80 || base == "" {
		return "an SQS queue name has 1 to 80 characters"
	}
	for i := 0; i < len(base); i++ {
		c := base[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return "an SQS queue name holds only letters, digits, '-' and '_' (and ends in .fifo for a FIFO queue)"
		}
	}
	return ""
}

// endpointProblem says why e is not an endpoint URL, or "".
func endpointProblem(e string) string {
	u, err := url.Parse(e)
	switch {
	case err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return "is not an http:// or https:// URL with a host"
	case u.User != nil:
		return "holds user info (not shown): credentials come from the AWS chain"
	case u.RawQuery != "" || u.Fragment != "":
		return "has a query or fragment: want scheme://host[:port][/path]"
	}
	return ""
}
