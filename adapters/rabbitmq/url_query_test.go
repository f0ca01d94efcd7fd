package rabbitmq

import (
	"net/url"
	"strings"
	"testing"
)

// TestURLQueryNothingSilentlyDropped: a parameter the URL gives is either
// applied or refused, naming it. Before, the query was read with
// url.URL.Query, which drops the pairs it cannot parse (a ';' separator, a
// bad %-escape), and an empty value was taken as "not given": a URL such as
// rabbit://user:pw@broker/orders?tls=tru%65 (a mistyped escape) or
// ?tls=true;declare=true opened a plain-text connection with the
// credentials in clear, and ?prefetch= or ?dlq= ran with the defaults,
// without a word.
func TestURLQueryNothingSilentlyDropped(t *testing.T) {
	t.Parallel()
	bad := map[string]string{
		"rabbit://user:pa55@broker/orders?tls=true;declare=true":      "malformed query",
		"rabbit://user:pa55@broker/orders?tls=tru%zz":                 "malformed query",
		"amqp://user:pa55@broker/orders?prefetch=64;declare=true":     "malformed query",
		"amqp://user:pa55@broker/orders?prefetch=":                    `parameter "prefetch" is empty`,
		"amqp://user:pa55@broker/orders?dlq=":                         `parameter "dlq" is empty`,
		"amqp://user:pa55@broker/orders?declare":                      `parameter "declare" is empty`,
		"amqps://user:pa55@broker/orders?tls_server_name=":            `parameter "tls_server_name" is empty`,
		"amqp://user:pa55@broker/orders?vhost=&queue_type=quorum":     `parameter "vhost" is empty`,
		"amqp://user:pa55@broker/orders?consumer_timeout=&plain=true": `parameter "consumer_timeout" is empty`,
	}
	for raw, want := range bad {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		cfg, err := ConfigFromURL(u)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("source %s: error %v (config %+v), want one containing %q", raw, err, cfg, want)
		}
		if _, _, err := SinkConfigFromURL(u); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("sink %s: error %v, want one containing %q", raw, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "pa55") {
			t.Errorf("%s: error leaks the password: %v", raw, err)
		}
	}
}
