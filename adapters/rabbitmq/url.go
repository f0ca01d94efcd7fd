package rabbitmq

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/internal/urlparam"
)

func init() {
	o := adapters.Opener{
		OpenSource: func(ctx context.Context, u *url.URL, o adapters.OpenOptions) (adapters.Source, error) {
			p, err := parseURL(u, urlparam.Source)
			if err != nil {
				return nil, err
			}
			cfg, err := p.sourceConfig()
			if err != nil {
				return nil, err
			}
			if err := p.withOptions(&cfg.TLS, o, urlparam.Source); err != nil {
				return nil, err
			}
			cfg.Logger, cfg.MeterProvider, cfg.TracerProvider = o.Logger, o.MeterProvider, o.TracerProvider
			return NewSource(ctx, cfg)
		},
		OpenSink: func(ctx context.Context, u *url.URL, o adapters.OpenOptions) (adapters.Sink, error) {
			p, err := parseURL(u, urlparam.Sink)
			if err != nil {
				return nil, err
			}
			cfg, declare, err := p.sinkConfig()
			if err != nil {
				return nil, err
			}
			if err := p.withOptions(&cfg.TLS, o, urlparam.Sink); err != nil {
				return nil, err
			}
			cfg.Logger, cfg.TracerProvider = o.Logger, o.TracerProvider
			if declare != nil {
				declare.TLS, declare.Logger = cfg.TLS, cfg.Logger
				if err := Declare(ctx, *declare); err != nil {
					return nil, err
				}
			}
			return NewSink(ctx, cfg)
		},
	}
	// A sink for a consumer's queue publishes to it; the consumer
	// declares the topology.
	o.SourceParams = append(append(params.Only(urlparam.Source), topologyParams...), "declare")
	adapters.Register("amqp", o)
	adapters.Register("amqps", o)
	adapters.Register("rabbit", o)
}

// The URL parameters: the table of sides, types and meanings that the
// package doc, docs/rabbitmq.md and the URL errors follow.
var params = func() *urlparam.Table {
	src, sink, both := urlparam.Source, urlparam.Sink, urlparam.Both
	t := urlparam.NewTable("rabbitmq", append([]urlparam.Param{
		{Name: "vhost", Side: both, Type: "string", Doc: "virtual host (default /)"},
		{Name: "queue_type", Side: both, Type: "classic or quorum", Doc: "type of every queue of the topology (default classic); a sink takes it only with declare=true"},
		{Name: "prefetch", Side: src, Type: "int in [0, 65535]", Doc: "basic.qos prefetch count (0: 128)"},
		{Name: "tiers", Side: both, Type: "list of durations", Doc: "delay tiers, one wait queue each, whole milliseconds (1s,10s,1m); a sink takes it only with declare=true"},
		{Name: "declare", Side: both, Type: "bool", Doc: "declare the topology (a source: before consuming; a sink: before publishing)"},
		{Name: "plain", Side: src, Type: "bool", Doc: "consume the queue as it is (a dead-letter queue): no topology, no Nack or DeadLetter"},
		{Name: "dlq", Side: both, Type: "string", Doc: "dead-letter queue (default QUEUE.dlq); a sink takes it only with declare=true"},
		{Name: "consumer_timeout", Side: src, Type: "duration or -1", Doc: "the broker's consumer_timeout (default 30m; -1: no warning)"},
		{Name: "consumer_timeout_warn", Side: src, Type: "duration", Doc: "warn and hand a delivery back after holding it this long (default 80% of consumer_timeout)"},
		{Name: "heartbeat", Side: both, Type: "duration", Doc: "AMQP heartbeat, whole seconds from 1s (default 10s)"},
		{Name: "connection_name", Side: both, Type: "string", Doc: "connection_name client property (default ackwise)"},
		{Name: "exchange", Side: sink, Type: "string", Doc: "exchange to publish to, instead of the path's queue"},
		{Name: "routing_key", Side: sink, Type: "string", Doc: "routing key (default: the message key on a named exchange)"},
		{Name: "tls", Side: both, Type: "bool", Doc: "rabbit:// only: true for TLS (amqps:// is TLS, amqp:// is not)"},
	}, urlparam.TLSParams()...)...)
	t.Schemes = []string{"amqp", "amqps", "rabbit"}
	t.NeedHost = true
	t.Form = "amqp://user:password@host:5672/<queue>"
	return t
}()

// Parameters that shape only the topology: a sink takes them with
// declare=true, for the topology it declares.
var topologyParams = []string{"dlq", "queue_type", "tiers"}

// ConfigFromURL builds a source Config from a URL of the form
//
//	amqp://user:password@host:5672/<queue>?vhost=/&queue_type=quorum&prefetch=64&tiers=1s,10s,1m&declare=true
//
// The path is the queue (the vhost is the vhost parameter, default "/").
// Schemes: amqp, amqps (TLS) and rabbit (amqp, or TLS with tls=true). The
// parameters are listed in the package doc, each for a source, a sink or
// both. An unknown, repeated or empty parameter is an error, and so are a
// parameter for sinks only, a bad value and a malformed query (a ';'
// separator, a bad %-escape); every such error matches
// adapters.ErrBadURL and names the URL parameter.
// Errors never contain the password.
func ConfigFromURL(u *url.URL) (Config, error) {
	p, err := parseURL(u, urlparam.Source)
	if err != nil {
		return Config{}, err
	}
	return p.sourceConfig()
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
	p, err := parseURL(u, urlparam.Sink)
	if err != nil {
		return SinkConfig{}, nil, err
	}
	return p.sinkConfig()
}

type parsedURL struct {
	q                    *urlparam.Query
	cfg                  Config
	queue                string
	exchange, routingKey string
	useTLS               bool
}

func (p *parsedURL) sourceConfig() (Config, error) {
	if p.queue == "" {
		return Config{}, p.q.Errorf("", "%s names no queue: want %s://host/<queue>", adapters.RedactURL(p.q.URL()), p.q.URL().Scheme)
	}
	return p.cfg, nil
}

func (p *parsedURL) sinkConfig() (SinkConfig, *Config, error) {
	q, c, u := p.q, p.cfg, p.q.URL()
	if !c.DeclareTopology {
		if k := q.First(topologyParams...); k != "" {
			return SinkConfig{}, nil, q.Misplaced(k, "is for a source, and for a sink only with declare=true (the topology to declare)")
		}
	}
	if p.queue != "" && (p.exchange != "" || p.routingKey != "") && !c.DeclareTopology {
		// One of the two destinations would be dropped without a word.
		return SinkConfig{}, nil, q.Errorf("", "%s names queue %q in its path and exchange %q routing_key %q: a sink publishes to one; drop the path, or the parameters (with declare=true the path is the queue to declare)", adapters.RedactURL(u), p.queue, p.exchange, p.routingKey)
	}
	sc := SinkConfig{URL: c.URL, TLS: c.TLS, Exchange: p.exchange, RoutingKey: p.routingKey, Heartbeat: c.Heartbeat, ConnectionName: c.ConnectionName}
	if sc.RoutingKey == "" && sc.Exchange == "" {
		if p.queue == "" {
			return SinkConfig{}, nil, q.Errorf("", "%s names no queue and no exchange: want %s://host/<queue> or ?exchange=…&routing_key=…", adapters.RedactURL(u), u.Scheme)
		}
		sc.RoutingKey = p.queue
	}
	var declare *Config
	if c.DeclareTopology {
		if p.queue == "" {
			return SinkConfig{}, nil, q.Errorf("declare", "needs the queue in the URL's path")
		}
		declare = &c
	}
	return sc, declare, nil
}

// withOptions applies the opener's TLS option to *tlsCfg, and refuses the
// options the side cannot use: another adapter's option, a meter provider
// on a sink (it has no metrics), a TLS config with a URL that is not TLS
// or beside the URL's TLS parameters (the option's *tls.Config is used as
// it is; merging the two would leave one of them silently unused).
func (p *parsedURL) withOptions(tlsCfg **tls.Config, o adapters.OpenOptions, side urlparam.Side) error {
	if err := o.CheckAdapterOptions("rabbitmq"); err != nil {
		return err
	}
	if side == urlparam.Sink && o.MeterProvider != nil {
		return adapters.UnsupportedOption("rabbitmq", "WithMeterProvider", "a sink has no metrics (a source counts its consumer-timeout warnings)")
	}
	if o.TLS == nil {
		return nil
	}
	if !p.useTLS {
		return adapters.UnsupportedOption("rabbitmq", "WithTLSConfig", fmt.Sprintf("URL %s does not use TLS: use amqps:// (or rabbit:// with tls=true)", adapters.RedactURL(p.q.URL())))
	}
	if k := p.q.First(urlparam.TLSParamNames...); k != "" {
		return p.q.Misplaced(k, "is given beside adapters.WithTLSConfig, whose *tls.Config is used as it is: set it there instead")
	}
	*tlsCfg = o.TLS
	return nil
}

func parseURL(u *url.URL, side urlparam.Side) (parsedURL, error) {
	var p parsedURL
	q, err := params.Parse(u, side)
	if err != nil {
		return p, err
	}
	p.q = q
	switch strings.ToLower(u.Scheme) {
	case "amqps":
		p.useTLS = true
	case "rabbit":
		q.Bool(&p.useTLS, "tls")
	}
	if q.Has("tls") && strings.ToLower(u.Scheme) != "rabbit" {
		return p, q.Misplaced("tls", "is for rabbit:// URLs; use amqps:// for TLS")
	}
	p.queue = strings.TrimPrefix(u.Path, "/")
	vhost := "/"
	q.String(&vhost, "vhost")
	amqpURL := url.URL{Scheme: "amqp", User: u.User, Host: u.Host, Path: "/"}
	if p.useTLS {
		amqpURL.Scheme = "amqps"
	}
	if vhost != "/" {
		amqpURL.Path = "/" + vhost
		amqpURL.RawPath = "/" + url.PathEscape(vhost)
	}
	c := Config{URL: amqpURL.String(), Queue: p.queue}
	urlparam.Enum(q, &c.QueueType, "queue_type", Classic, Quorum)
	q.String(&c.DeadLetterQueue, "dlq")
	q.String(&c.ConnectionName, "connection_name")
	q.String(&p.exchange, "exchange")
	q.String(&p.routingKey, "routing_key")
	urlparam.Int(q, &c.Prefetch, "prefetch", 0, 65535)
	q.Bool(&c.Plain, "plain")
	q.Bool(&c.DeclareTopology, "declare")
	if q.Durations(&c.DelayTiers, "tiers", time.Millisecond, urlparam.MaxDuration) {
		for _, d := range c.DelayTiers {
			if d%time.Millisecond != 0 {
				q.Fail(q.Errorf("tiers", "%v is not a whole number of milliseconds", d))
			}
		}
	}
	q.Duration(&c.ConsumerTimeout, "consumer_timeout", -1, urlparam.MaxDuration)
	q.Duration(&c.ConsumerTimeoutWarn, "consumer_timeout_warn", 0, urlparam.MaxDuration)
	if q.Duration(&c.Heartbeat, "heartbeat", 0, maxHeartbeat) && c.Heartbeat > 0 && c.Heartbeat < time.Second {
		q.Fail(q.Errorf("heartbeat", "want at least 1s: AMQP counts it in whole seconds (0: the default)"))
	}
	if err := q.Err(); err != nil {
		return p, err
	}
	if err := checkURLCombinations(q, c, side); err != nil {
		return p, err
	}
	if k := q.First(urlparam.TLSParamNames...); k != "" && !p.useTLS {
		return p, q.Misplaced(k, "needs TLS: use amqps:// (or rabbit:// with tls=true)")
	}
	c.TLS = q.TLS()
	if err := q.Err(); err != nil {
		return p, err
	}
	p.cfg = c
	return p, nil
}

// checkURLCombinations refuses the combinations of parameters that
// Config.validate would refuse naming Config fields, naming the URL
// parameters instead. The names of the topology are checked when the URL
// is a source's or declares it (declare=true): a sink publishing through
// the default exchange uses the path's queue name only as its routing key.
func checkURLCombinations(q *urlparam.Query, c Config, side urlparam.Side) error {
	if c.Plain {
		k := q.First("tiers", "dlq")
		if c.DeclareTopology {
			k = "declare"
		}
		if k != "" {
			return q.Errorf(k, "cannot go with plain=true: a plain source declares nothing, and has no wait queues or dead-letter queue")
		}
	}
	switch {
	case c.ConsumerTimeout == -1 && q.Has("consumer_timeout_warn"):
		return q.Errorf("consumer_timeout_warn", "cannot go with consumer_timeout=-1, which turns the warning off")
	case c.ConsumerTimeout > 0 && c.ConsumerTimeoutWarn > c.ConsumerTimeout:
		return q.Errorf("consumer_timeout_warn", "is longer than consumer_timeout = %v", c.ConsumerTimeout)
	case c.ConsumerTimeout == 0 && c.ConsumerTimeoutWarn > DefaultConsumerTimeout:
		return q.Errorf("consumer_timeout_warn", "is longer than the default consumer_timeout, %v", DefaultConsumerTimeout)
	}
	if side != urlparam.Source && !c.DeclareTopology || c.Queue == "" {
		return nil // no topology; a URL without a queue is refused by its caller
	}
	if why := queueNameProblem(c.Queue); why != "" {
		return q.Errorf("", "path names queue %q: %s", c.Queue, why)
	}
	if c.Plain {
		return nil // a plain source has no other queues
	}
	dlq := c.DeadLetterQueue
	if dlq == "" {
		dlq = c.Queue + ".dlq"
		if why := queueNameProblem(dlq); why != "" {
			return q.Errorf("", "path names queue %q, whose dead-letter queue %q would be %s: name another with dlq=", c.Queue, dlq, why)
		}
	} else if why := queueNameProblem(dlq); why != "" {
		return q.Errorf("dlq", "%s", why)
	}
	if dlq == c.Queue {
		return q.Errorf("dlq", "is the queue itself")
	}
	tiers := slices.Compact(slices.Sorted(slices.Values(c.DelayTiers)))
	if len(tiers) > maxTiers {
		return q.Errorf("tiers", "has %d distinct tiers: at most %d", len(tiers), maxTiers)
	}
	for _, t := range tiers {
		name := WaitQueueName(c.Queue, t)
		switch why := queueNameProblem(name); {
		case why != "":
			return q.Errorf("tiers", "the wait queue of %v, %q, would be %s", t, name, why)
		case name == dlq:
			return q.Errorf("dlq", "is the wait queue of the delay tier %v", t)
		}
	}
	return nil
}
