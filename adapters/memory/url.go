package memory

import (
	"context"
	"math"
	"net/url"
	"strings"

	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/internal/urlparam"
)

// Scheme is the URL scheme of the in-memory broker.
const Scheme = "mem"

func init() {
	adapters.Register(Scheme, adapters.Opener{OpenSource: openSource, OpenSink: openSink})
}

// Parameters of "mem://" URLs.
//
//	mem://orders                                a queue on Default()
//	mem://orders?lease=10s&max_receives=5&dlq=orders.dead&fifo=true
//	mem://events?partitions=4&group=billing     a log; group is required for a source
//	mem://events?partitions=4&retention=100000
//
// Queue parameters: lease (a Go duration, QueueConfig.Lease), max_receives
// (QueueConfig.MaxReceives), dlq (QueueConfig.DeadLetter), fifo (a bool,
// QueueConfig.FIFO). Log parameters: partitions (TopicConfig.Partitions),
// retention (TopicConfig.Retention), dlq (TopicConfig.DeadLetter), group (the
// consumer group). Any of partitions, retention or group makes the URL a log.
// Every parameter is taken by source and sink URLs alike (on a sink, group
// only makes the URL a log).
// A URL with configuration parameters creates the destination with them (and
// defaults for the others), or checks that the existing one has them
// (ErrConflict otherwise; the parameters left out are not checked); a URL
// with none uses the destination as it is, creating it with the broker's
// defaults.
// An unknown parameter, a repeated or empty one, a malformed query (a ';'
// separator, a bad %-escape) or a bad value is an error naming the
// parameter and the value. User info is ignored; a URL with an '@' after
// its host (a password cut short by an unescaped '/', '?' or '#') is
// refused without being shown, as the Kafka and RabbitMQ openers refuse it
// (adapters.RefuseMisplacedUserInfo): write a literal '@' in a name as %40.
const (
	// ParamLease is QueueConfig.Lease, a Go duration ("30s").
	ParamLease = "lease"
	// ParamMaxReceives is QueueConfig.MaxReceives.
	ParamMaxReceives = "max_receives"
	// ParamDLQ is QueueConfig.DeadLetter or TopicConfig.DeadLetter.
	ParamDLQ = "dlq"
	// ParamFIFO is QueueConfig.FIFO ("true", "false").
	ParamFIFO = "fifo"
	// ParamPartitions is TopicConfig.Partitions; it makes the URL a log.
	ParamPartitions = "partitions"
	// ParamRetention is TopicConfig.Retention; it makes the URL a log.
	ParamRetention = "retention"
	// ParamGroup is the consumer group of a log source; it makes the URL a
	// log.
	ParamGroup = "group"
)

// params is the table of "mem://" URL parameters.
var params = func() *urlparam.Table {
	t := urlparam.NewTable("memory",
		urlparam.Param{Name: ParamLease, Side: urlparam.Both, Type: "positive duration", Doc: "queue: how long a delivery is leased before it is redelivered"},
		urlparam.Param{Name: ParamMaxReceives, Side: urlparam.Both, Type: "int ≥ 0", Doc: "queue: deliveries before the broker dead-letters a message (0: no limit)"},
		urlparam.Param{Name: ParamDLQ, Side: urlparam.Both, Type: "string", Doc: "the dead-letter queue (default NAME.dlq)"},
		urlparam.Param{Name: ParamFIFO, Side: urlparam.Both, Type: "bool", Doc: "queue: deliver each key's messages one at a time, in order"},
		urlparam.Param{Name: ParamPartitions, Side: urlparam.Both, Type: "int in [1, 65536]", Doc: "log: number of partitions; makes the URL a log"},
		urlparam.Param{Name: ParamRetention, Side: urlparam.Both, Type: "int ≥ 0", Doc: "log: records kept per partition (0: all); makes the URL a log"},
		urlparam.Param{Name: ParamGroup, Side: urlparam.Both, Type: "string", Doc: "log: the consumer group (a log source needs one); makes the URL a log"},
	)
	t.Schemes = []string{Scheme}
	return t
}()

// target is a parsed "mem://" URL.
type target struct {
	name   string
	log    bool
	group  string
	queue  *QueueConfig // nil: no configuration parameters
	topic  *TopicConfig
	broker *Broker
	given  *urlparam.Query // the parameters the URL sets
}

// keepUnset makes the configuration of an existing destination what the
// URL checks against it, overridden only by the parameters the URL gives:
// a parameter left out means "whatever it is", not the default.
func (tg *target) keepUnset() {
	switch d := tg.broker.lookup(tg.name).(type) {
	case *topic:
		if tg.topic == nil {
			return
		}
		c := d.cfg
		if tg.given.Has(ParamPartitions) {
			c.Partitions = tg.topic.Partitions
		}
		if tg.given.Has(ParamRetention) {
			c.Retention = tg.topic.Retention
		}
		if tg.given.Has(ParamDLQ) {
			c.DeadLetter = tg.topic.DeadLetter
		}
		*tg.topic = c
	case *queue:
		if tg.queue == nil {
			return
		}
		c := d.cfg
		if tg.given.Has(ParamLease) {
			c.Lease = tg.queue.Lease
		}
		if tg.given.Has(ParamMaxReceives) {
			c.MaxReceives = tg.queue.MaxReceives
		}
		if tg.given.Has(ParamDLQ) {
			c.DeadLetter = tg.queue.DeadLetter
		}
		if tg.given.Has(ParamFIFO) {
			c.FIFO = tg.queue.FIFO
		}
		*tg.queue = c
	}
}

func parseURL(u *url.URL, side urlparam.Side) (target, error) {
	tg := target{broker: Default()}
	// Parse refuses first a password cut short by an unescaped '/', '?' or
	// '#', now in the name, a parameter or the fragment, which the errors
	// below would quote ("mem://u:12345?S3CRET@q" named the parameter
	// "S3CRET@q").
	q, err := params.Parse(u, side)
	if err != nil {
		return tg, err
	}
	switch {
	case u.Opaque != "":
		tg.name = u.Opaque
	default:
		tg.name = strings.Trim(u.Host+u.Path, "/")
	}
	if tg.name == "" {
		return tg, q.Errorf("", "%s names no queue or topic (want mem://NAME)", adapters.RedactURL(u))
	}
	var qc QueueConfig
	var tc TopicConfig
	q.Duration(&qc.Lease, ParamLease, 1, urlparam.MaxDuration)
	urlparam.Int(q, &qc.MaxReceives, ParamMaxReceives, 0, math.MaxInt)
	q.Bool(&qc.FIFO, ParamFIFO)
	q.String(&qc.DeadLetter, ParamDLQ)
	tc.DeadLetter = qc.DeadLetter
	urlparam.Int(q, &tc.Partitions, ParamPartitions, 1, 1<<16)
	urlparam.Int(q, &tc.Retention, ParamRetention, 0, math.MaxInt)
	q.String(&tg.group, ParamGroup)
	if err := q.Err(); err != nil {
		return tg, err
	}
	tg.given = q
	tg.log = q.First(ParamPartitions, ParamRetention, ParamGroup) != ""
	switch {
	case tg.log:
		if k := q.First(ParamLease, ParamMaxReceives, ParamFIFO); k != "" {
			return tg, q.Errorf(k, "is a queue parameter, but %s, %s or %s make the URL a log", ParamPartitions, ParamRetention, ParamGroup)
		}
		if q.First(ParamPartitions, ParamRetention, ParamDLQ) != "" {
			tg.topic = &tc
		}
	case q.First(ParamLease, ParamMaxReceives, ParamFIFO, ParamDLQ) != "":
		tg.queue = &qc
	}
	return tg, nil
}

func openSource(ctx context.Context, u *url.URL, o adapters.OpenOptions) (adapters.Source, error) {
	b, ob, err := openOptions(o)
	if err != nil {
		return nil, err
	}
	tg, err := parseURL(u, urlparam.Source)
	if err != nil {
		return nil, err
	}
	tg.broker = b
	tg.keepUnset()
	if tg.log {
		if !tg.given.Require(ParamGroup, "a log source needs one (partitions= and retention= make the URL a log)") {
			return nil, tg.given.Err()
		}
		t, err := tg.broker.topic(tg.name, tg.topic)
		if err != nil {
			return nil, err
		}
		s, err := tg.broker.JoinGroup(tg.name, tg.group)
		if err != nil {
			return nil, err
		}
		t.observe(&s.source, ob)
		return s, nil
	}
	q, err := tg.broker.queue(tg.name, tg.queue)
	if err != nil {
		return nil, err
	}
	s, err := tg.broker.QueueSource(tg.name)
	if err != nil {
		return nil, err
	}
	q.observe(&s.source, ob)
	return s, nil
}

func openSink(ctx context.Context, u *url.URL, o adapters.OpenOptions) (adapters.Sink, error) {
	b, ob, err := openOptions(o)
	if err != nil {
		return nil, err
	}
	tg, err := parseURL(u, urlparam.Sink)
	if err != nil {
		return nil, err
	}
	tg.broker = b
	tg.keepUnset()
	switch {
	case tg.log:
		if _, err := tg.broker.topic(tg.name, tg.topic); err != nil {
			return nil, err
		}
	case tg.queue != nil:
		if _, err := tg.broker.queue(tg.name, tg.queue); err != nil {
			return nil, err
		}
	}
	// Without parameters, publish into whatever name is (a queue by default).
	s, err := tg.broker.Sink(tg.name)
	if err != nil {
		return nil, err
	}
	s.obs = ob
	return s, nil
}
