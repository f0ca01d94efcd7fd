package memory

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ackwise/ackwise/adapters"
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
// A URL with configuration parameters creates the destination with them (and
// defaults for the others), or checks that the existing one has them
// (ErrConflict otherwise; the parameters left out are not checked); a URL
// with none uses the destination as it is, creating it with the broker's
// defaults.
// An unknown parameter, a repeated one or a bad value is an error naming the
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

// target is a parsed "mem://" URL.
type target struct {
	name   string
	log    bool
	group  string
	queue  *QueueConfig // nil: no configuration parameters
	topic  *TopicConfig
	broker *Broker
	given  url.Values // the parameters the URL sets
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

func parseURL(u *url.URL) (target, error) {
	tg := target{broker: Default()}
	// First: a password cut short by an unescaped '/', '?' or '#' is now in
	// the name, a parameter or the fragment, which the errors below quote
	// ("mem://u:12345?S3CRET@q" named the parameter "S3CRET@q").
	if err := adapters.RefuseMisplacedUserInfo("memory", u); err != nil {
		return tg, err
	}
	switch {
	case u.Opaque != "":
		tg.name = u.Opaque
	default:
		tg.name = strings.Trim(u.Host+u.Path, "/")
	}
	if tg.name == "" {
		return tg, fmt.Errorf("memory: URL %s names no queue or topic (want mem://NAME)", adapters.RedactURL(u))
	}
	vals, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return tg, fmt.Errorf("memory: URL query %q: %w", u.RawQuery, err)
	}
	var qc QueueConfig
	tc := TopicConfig{}
	var qset, tset bool
	for k, vs := range vals {
		if len(vs) != 1 {
			return tg, fmt.Errorf("memory: URL parameter %s given %d times (%q)", k, len(vs), vs)
		}
		v := vs[0]
		bad := func(why string) error {
			return fmt.Errorf("memory: URL parameter %s = %q: %s", k, v, why)
		}
		switch k {
		case ParamLease:
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return tg, bad("want a positive duration such as 30s")
			}
			qc.Lease, qset = d, true
		case ParamMaxReceives:
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return tg, bad("want a non-negative integer (0: no limit)")
			}
			qc.MaxReceives, qset = n, true
		case ParamFIFO:
			f, err := strconv.ParseBool(v)
			if err != nil {
				return tg, bad("want true or false")
			}
			qc.FIFO, qset = f, true
		case ParamDLQ:
			if v == "" {
				return tg, bad("want a queue name")
			}
			qc.DeadLetter, tc.DeadLetter = v, v
		case ParamPartitions:
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 1<<16 {
				return tg, bad("want an integer in [1, 65536]")
			}
			tc.Partitions, tset, tg.log = n, true, true
		case ParamRetention:
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return tg, bad("want a non-negative integer (0 keeps everything)")
			}
			tc.Retention, tset, tg.log = n, true, true
		case ParamGroup:
			if v == "" {
				return tg, bad("want a consumer group name")
			}
			tg.group, tg.log = v, true
		default:
			return tg, fmt.Errorf("memory: unknown URL parameter %s = %q (known: %s, %s, %s, %s, %s, %s, %s)", k, v,
				ParamLease, ParamMaxReceives, ParamDLQ, ParamFIFO, ParamPartitions, ParamRetention, ParamGroup)
		}
	}
	if _, ok := vals[ParamDLQ]; ok {
		qset, tset = true, true
	}
	tg.given = vals
	if tg.log {
		for _, k := range []string{ParamLease, ParamMaxReceives, ParamFIFO} {
			if v, ok := vals[k]; ok {
				return tg, fmt.Errorf("memory: URL parameter %s = %q is a queue parameter, but %s/%s/%s make the URL a log", k, v[0], ParamPartitions, ParamRetention, ParamGroup)
			}
		}
		if tset {
			tg.topic = &tc
		}
	} else if qset {
		tg.queue = &qc
	}
	return tg, nil
}

func openSource(ctx context.Context, u *url.URL, _ adapters.OpenOptions) (adapters.Source, error) {
	tg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	tg.keepUnset()
	if tg.log {
		if tg.group == "" {
			return nil, fmt.Errorf("memory: URL parameter %s = \"\": a log source needs a consumer group (%s?%s=NAME)", ParamGroup, u.Redacted(), ParamGroup)
		}
		if _, err := tg.broker.topic(tg.name, tg.topic); err != nil {
			return nil, err
		}
		return tg.broker.JoinGroup(tg.name, tg.group)
	}
	if _, err := tg.broker.queue(tg.name, tg.queue); err != nil {
		return nil, err
	}
	return tg.broker.QueueSource(tg.name)
}

func openSink(ctx context.Context, u *url.URL, _ adapters.OpenOptions) (adapters.Sink, error) {
	tg, err := parseURL(u)
	if err != nil {
		return nil, err
	}
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
	return tg.broker.Sink(tg.name)
}
