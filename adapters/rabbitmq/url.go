package rabbitmq

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ackwise/ackwise/adapters"
)

func init() {
	o := adapters.Opener{
		OpenSource: func(ctx context.Context, u *url.URL, _ adapters.OpenOptions) (adapters.Source, error) {
			cfg, err := ConfigFromURL(u)
			if err != nil {
				return nil, err
			}
			return NewSource(ctx, cfg)
		},
		OpenSink: func(ctx context.Context, u *url.URL, _ adapters.OpenOptions) (adapters.Sink, error) {
			cfg, declare, err := SinkConfigFromURL(u)
			if err != nil {
				return nil, err
			}
			if declare != nil {
				if err := Declare(ctx, *declare); err != nil {
					return nil, err
				}
			}
			return NewSink(ctx, cfg)
		},
	}
	adapters.Register("amqp", o)
	adapters.Register("amqps", o)
	adapters.Register("rabbit", o)
}

// URL query parameters, all optional.
var urlParams = map[string]string{
	"vhost":                    "virtual host (default /)",
	"queue_type":               "classic or quorum",
	"prefetch":                 "basic.qos prefetch count",
	"tiers":                    "comma-separated delay tiers, e.g. 1s,10s,1m",
	"declare":                  "true to declare the topology",
	"plain":                    "true to consume the queue as it is (a dead-letter queue): no topology, no Nack or DeadLetter",
	"dlq":                      "dead-letter queue name",
	"consumer_timeout":         "the broker's consumer_timeout, or -1",
	"consumer_timeout_warn":    "warn after holding a delivery this long",
	"heartbeat":                "AMQP heartbeat interval",
	"connection_name":          "connection_name client property",
	"exchange":                 "exchange to publish to",
	"routing_key":              "routing key",
	"tls":                      "rabbit:// only: true for TLS",
	"tls_ca":                   "PEM file of the CA to trust",
	"tls_cert":                 "PEM file of the client certificate",
	"tls_key":                  "PEM file of the client key",
	"tls_server_name":          "server name to verify",
	"tls_insecure_skip_verify": "true to skip verification (tests only)",
}

// Parameters of one side only: the other would ignore them, so a URL that
// gives one there is refused. The topology parameters apply to a sink too
// when it declares the topology (declare=true).
var (
	sourceOnlyParams = []string{"consumer_timeout", "consumer_timeout_warn", "plain", "prefetch"}
	topologyParams   = []string{"dlq", "queue_type", "tiers"}
	sinkOnlyParams   = []string{"exchange", "routing_key"}
)

// onlyFor refuses the first of params that q gives, saying where it
// applies.
func onlyFor(u *url.URL, q url.Values, params []string, applies string) error {
	for _, k := range params {
		if q.Has(k) {
			return fmt.Errorf("rabbitmq: URL %s: parameter %q applies to %s", adapters.RedactURL(u), k, applies)
		}
	}
	return nil
}

// ConfigFromURL builds a source Config from a URL of the form
//
//	amqp://user:password@host:5672/<queue>?vhost=/&queue_type=quorum&prefetch=64&tiers=1s,10s,1m&declare=true
//
// The path is the queue (the vhost is the vhost parameter, default "/").
// Schemes: amqp, amqps (TLS) and rabbit (amqp, or TLS with tls=true). TLS
// parameters: tls_ca, tls_cert, tls_key (PEM files), tls_server_name,
// tls_insecure_skip_verify. Other parameters: plain (true: consume the queue
// as it is, Config.Plain), dlq, consumer_timeout, consumer_timeout_warn,
// heartbeat (Go durations), connection_name. exchange and routing_key are for
// sinks only (SinkConfigFromURL). An unknown, repeated or empty parameter is
// an error, and so are a parameter for sinks only and a malformed query (a
// ';' separator, a bad %-escape). Errors never contain the password.
func ConfigFromURL(u *url.URL) (Config, error) {
	p, err := parseURL(u)
	if err != nil {
		return Config{}, err
	}
	if err := onlyFor(u, p.q, sinkOnlyParams, "sinks only"); err != nil {
		return Config{}, err
	}
	if p.queue == "" {
		return Config{}, fmt.Errorf("rabbitmq: URL %s names no queue: want %s://host/<queue>", adapters.RedactURL(u), u.Scheme)
	}
	return p.cfg, nil
}

// SinkConfigFromURL builds a SinkConfig from a URL like ConfigFromURL's:
// the path is the queue to publish to through the default exchange, or the
// exchange and routing_key parameters name the destination; not both,
// except with declare=true, which also returns the Config whose topology
// (the path's queue) to declare first. The source parameters prefetch,
// plain, consumer_timeout and consumer_timeout_warn are errors, and so are
// queue_type, tiers and dlq without declare=true (they shape only the
// topology to declare).
func SinkConfigFromURL(u *url.URL) (SinkConfig, *Config, error) {
	p, err := parseURL(u)
	if err != nil {
		return SinkConfig{}, nil, err
	}
	c := p.cfg
	if err := onlyFor(u, p.q, sourceOnlyParams, "sources only"); err != nil {
		return SinkConfig{}, nil, err
	}
	if !c.DeclareTopology {
		if err := onlyFor(u, p.q, topologyParams, "sources, and to sinks only with declare=true (the topology to declare)"); err != nil {
			return SinkConfig{}, nil, err
		}
	}
	if p.queue != "" && (p.exchange != "" || p.routingKey != "") && !c.DeclareTopology {
		// One of the two destinations would be dropped without a word.
		return SinkConfig{}, nil, fmt.Errorf("rabbitmq: URL %s names queue %q in its path and exchange %q routing_key %q: a sink publishes to one; drop the path, or the parameters (with declare=true the path is the queue to declare)", adapters.RedactURL(u), p.queue, p.exchange, p.routingKey)
	}
	sc := SinkConfig{URL: c.URL, TLS: c.TLS, Exchange: p.exchange, RoutingKey: p.routingKey, Heartbeat: c.Heartbeat, ConnectionName: c.ConnectionName}
	if sc.RoutingKey == "" && sc.Exchange == "" {
		if p.queue == "" {
			return SinkConfig{}, nil, fmt.Errorf("rabbitmq: URL %s names no queue and no exchange: want %s://host/<queue> or ?exchange=…&routing_key=…", adapters.RedactURL(u), u.Scheme)
		}
		sc.RoutingKey = p.queue
	}
	var declare *Config
	if c.DeclareTopology {
		if p.queue == "" {
			return SinkConfig{}, nil, fmt.Errorf("rabbitmq: URL %s: declare=true needs the queue in the path", adapters.RedactURL(u))
		}
		declare = &c
	}
	return sc, declare, nil
}

type parsedURL struct {
	q                    url.Values // the parameters given
	cfg                  Config
	queue                string
	exchange, routingKey string
}

func parseURL(u *url.URL) (parsedURL, error) {
	var p parsedURL
	if err := adapters.RefuseMisplacedUserInfo("rabbitmq", u); err != nil {
		return p, err
	}
	// Not u.Query(): it drops the pairs it cannot parse (a ';' separator, a
	// bad %-escape), which would leave a parameter (tls=true among them)
	// silently unset.
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return p, fmt.Errorf("rabbitmq: URL %s: malformed query: %v", adapters.RedactURL(u), err)
	}
	for k, vs := range q {
		if _, ok := urlParams[k]; !ok {
			return p, fmt.Errorf("rabbitmq: URL %s: unknown parameter %q", adapters.RedactURL(u), k)
		}
		if len(vs) > 1 {
			return p, fmt.Errorf("rabbitmq: URL %s: parameter %q given %d times", adapters.RedactURL(u), k, len(vs))
		}
		if vs[0] == "" {
			// Read as "not given", it would run with the default.
			return p, fmt.Errorf("rabbitmq: URL %s: parameter %q is empty: give a value or leave it out", adapters.RedactURL(u), k)
		}
	}
	bad := func(k string, err error) error {
		return fmt.Errorf("rabbitmq: URL %s: parameter %s = %q: %v", adapters.RedactURL(u), k, q.Get(k), err)
	}
	useTLS := false
	switch strings.ToLower(u.Scheme) {
	case "amqp":
	case "amqps":
		useTLS = true
	case "rabbit":
		if v := q.Get("tls"); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return p, bad("tls", err)
			}
			useTLS = b
		}
	default:
		return p, fmt.Errorf("rabbitmq: URL %s: scheme %q: want amqp, amqps or rabbit", adapters.RedactURL(u), u.Scheme)
	}
	if q.Has("tls") && strings.ToLower(u.Scheme) != "rabbit" {
		return p, fmt.Errorf("rabbitmq: URL %s: parameter tls is for rabbit:// URLs; use amqps:// for TLS", adapters.RedactURL(u))
	}
	if u.Host == "" {
		return p, fmt.Errorf("rabbitmq: URL %s has no host", adapters.RedactURL(u))
	}
	p.queue = strings.TrimPrefix(u.Path, "/")
	vhost := q.Get("vhost")
	if vhost == "" {
		vhost = "/"
	}
	amqpURL := url.URL{Scheme: "amqp", User: u.User, Host: u.Host, Path: "/"}
	if useTLS {
		amqpURL.Scheme = "amqps"
	}
	if vhost != "/" {
		amqpURL.Path = "/" + vhost
		amqpURL.RawPath = "/" + url.PathEscape(vhost)
	}
	c := Config{URL: amqpURL.String(), Queue: p.queue, QueueType: QueueType(q.Get("queue_type")), DeadLetterQueue: q.Get("dlq"), ConnectionName: q.Get("connection_name")}
	p.exchange, p.routingKey = q.Get("exchange"), q.Get("routing_key")
	if v := q.Get("prefetch"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return p, bad("prefetch", err)
		}
		c.Prefetch = n
	}
	if v := q.Get("plain"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return p, bad("plain", err)
		}
		c.Plain = b
	}
	if v := q.Get("declare"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return p, bad("declare", err)
		}
		c.DeclareTopology = b
	}
	if v := q.Get("tiers"); v != "" {
		for _, s := range strings.Split(v, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(s))
			if err != nil {
				return p, bad("tiers", err)
			}
			c.DelayTiers = append(c.DelayTiers, d)
		}
	}
	for k, dst := range map[string]*time.Duration{"consumer_timeout": &c.ConsumerTimeout, "consumer_timeout_warn": &c.ConsumerTimeoutWarn, "heartbeat": &c.Heartbeat} {
		v := q.Get(k)
		if v == "" {
			continue
		}
		if v == "-1" {
			*dst = -1
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			return p, bad(k, err)
		}
		*dst = d
	}
	tlsParams := []string{"tls_ca", "tls_cert", "tls_key", "tls_server_name", "tls_insecure_skip_verify"}
	anyTLS := false
	for _, k := range tlsParams {
		anyTLS = anyTLS || q.Has(k)
	}
	if anyTLS {
		if !useTLS {
			return p, fmt.Errorf("rabbitmq: URL %s: TLS parameters need amqps:// (or rabbit:// with tls=true)", adapters.RedactURL(u))
		}
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: q.Get("tls_server_name")}
		if v := q.Get("tls_insecure_skip_verify"); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return p, bad("tls_insecure_skip_verify", err)
			}
			tc.InsecureSkipVerify = b
		}
		if f := q.Get("tls_ca"); f != "" {
			pem, err := os.ReadFile(f)
			if err != nil {
				return p, bad("tls_ca", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return p, bad("tls_ca", fmt.Errorf("no PEM certificate in the file"))
			}
			tc.RootCAs = pool
		}
		cert, key := q.Get("tls_cert"), q.Get("tls_key")
		if (cert == "") != (key == "") {
			return p, fmt.Errorf("rabbitmq: URL %s: tls_cert and tls_key go together", adapters.RedactURL(u))
		}
		if cert != "" {
			pair, err := tls.LoadX509KeyPair(cert, key)
			if err != nil {
				return p, bad("tls_cert", err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		c.TLS = tc
	}
	p.cfg, p.q = c, q
	return p, nil
}
