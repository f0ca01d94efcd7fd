package main

import (
	"cmp"
	"net/url"
	"slices"
	"strings"
)

// sameDestination reports whether two URLs name the same destination:
// the same scheme, host and path (destPath: a RabbitMQ target's routing
// key too), whatever the rest of the query (a source URL carries ?group=, a
// sink URL need not), the user info, the case of the scheme and
// host, and a trailing '/'; amqp, amqps and rabbit count as one scheme, a
// broker's default ports as no port, a RabbitMQ vhost as part of the path.
// URLs that do not parse are left to the opener.
func sameDestination(a, b string) bool {
	ua, err := url.Parse(a)
	if err != nil {
		return false
	}
	ub, err := url.Parse(b)
	if err != nil {
		return false
	}
	return destScheme(ua) == destScheme(ub) && destHost(ua) == destHost(ub) &&
		destPath(ua) == destPath(ub) && ua.Opaque == ub.Opaque
}

// destPath is the queue or topic u names: its path without '/' at either
// end, or, for a RabbitMQ URL with a routing_key and no exchange, the
// routing key (a sink publishes through the default exchange to the queue
// of that name, whatever the path: rabbitmq.SinkConfigFromURL).
// A RabbitMQ queue is named within its vhost, which comes first.
func destPath(u *url.URL) string {
	if destScheme(u) == "amqp" {
		// u.Query(), as the RabbitMQ opener reads it.
		q := u.Query()
		vhost := cmp.Or(q.Get("vhost"), "/")
		if q.Get("routing_key") != "" && q.Get("exchange") == "" {
			return vhost + "\x00" + q.Get("routing_key")
		}
		return vhost + "\x00" + strings.Trim(u.Path, "/")
	}
	return strings.Trim(u.Path, "/")
}

// destScheme is u's scheme in lower case, the RabbitMQ ones (amqp, amqps,
// rabbit) as one: they reach the same broker.
func destScheme(u *url.URL) string {
	s := strings.ToLower(u.Scheme)
	if s == "amqps" || s == "rabbit" {
		return "amqp"
	}
	return s
}

// destHost is u's host in lower case, without the broker's default ports
// (RabbitMQ's, Kafka's 9092, SQS's 443); a Kafka URL's hosts in sorted order (the
// client takes them as a set).
func destHost(u *url.URL) string {
	hosts := strings.Split(strings.ToLower(u.Host), ",")
	for i, h := range hosts {
		switch destScheme(u) {
		case "amqp":
			h = strings.TrimSuffix(strings.TrimSuffix(h, ":5672"), ":5671")
		case "kafka":
			h = strings.TrimSuffix(h, ":9092")
		case "awssqs":
			h = strings.TrimSuffix(h, ":443") // the queue URL is https://
		}
		hosts[i] = h
	}
	slices.Sort(hosts)
	return strings.Join(hosts, ",")
}
