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
		"rabbit://user:pa55@broker/orders?tls=true;declare=true":      "URL query is malformed",
		"rabbit://user:pa55@broker/orders?tls=tru%zz":                 "URL query is malformed",
		"amqp://user:pa55@broker/orders?prefetch=64;declare=true":     "URL query is malformed",
		"amqp://user:pa55@broker/orders?prefetch=":                    `URL parameter "prefetch" is empty`,
		"amqp://user:pa55@broker/orders?dlq=":                         `URL parameter "dlq" is empty`,
		"amqp://user:pa55@broker/orders?declare":                      `URL parameter "declare" is empty`,
		"amqps://user:pa55@broker/orders?tls_server_name=":            `URL parameter "tls_server_name" is empty`,
		"amqp://user:pa55@broker/orders?vhost=&queue_type=quorum":     `URL parameter "vhost" is empty`,
		"amqp://user:pa55@broker/orders?consumer_timeout=&plain=true": `URL parameter "consumer_timeout" is empty`,
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

// TestURLParametersOfTheOtherSideRefused: a parameter only the other side
// uses is refused, naming it and where it applies, rather than ignored.
// Before, ?prefetch=64 on a sink URL or ?exchange=x on a source URL was
// accepted without effect.
func TestURLParametersOfTheOtherSideRefused(t *testing.T) {
	t.Parallel()
	parse := func(raw string) *url.URL {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		return u
	}
	sinkBad := map[string]string{
		"amqp://user:pa55@broker/orders?prefetch=64":                 `URL parameter "prefetch" is for a source; a sink URL does not take it`,
		"amqp://user:pa55@broker/orders?plain=true":                  `URL parameter "plain" is for a source; a sink URL does not take it`,
		"amqp://user:pa55@broker/orders?consumer_timeout=1h":         `URL parameter "consumer_timeout" is for a source; a sink URL does not take it`,
		"amqp://user:pa55@broker/orders?consumer_timeout_warn=1m":    `URL parameter "consumer_timeout_warn" is for a source; a sink URL does not take it`,
		"amqp://user:pa55@broker/orders?declare=true&prefetch=64":    `URL parameter "prefetch" is for a source; a sink URL does not take it`,
		"amqp://user:pa55@broker/orders?tiers=1s,1m":                 `URL parameter "tiers" is for a source, and for a sink only with declare=true`,
		"amqp://user:pa55@broker/orders?queue_type=quorum":           `URL parameter "queue_type" is for a source, and for a sink only with declare=true`,
		"amqp://user:pa55@broker/orders?dlq=orders.dead":             `URL parameter "dlq" is for a source, and for a sink only with declare=true`,
		"amqp://user:pa55@broker/orders?declare=false&tiers=1s,1m":   `URL parameter "tiers" is for a source, and for a sink only with declare=true`,
		"amqp://user:pa55@broker/orders?declare=false&dlq=elsewhere": `URL parameter "dlq" is for a source, and for a sink only with declare=true`,
	}
	for raw, want := range sinkBad {
		if _, _, err := SinkConfigFromURL(parse(raw)); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "pa55") {
			t.Errorf("sink %s: error %v, want one containing %q (and no password)", raw, err, want)
		}
		if _, err := ConfigFromURL(parse(raw)); err != nil {
			t.Errorf("source %s: %v", raw, err)
		}
	}
	sourceBad := map[string]string{
		"amqp://user:pa55@broker/orders?exchange=events":     `URL parameter "exchange" is for a sink; a source URL does not take it`,
		"amqp://user:pa55@broker/orders?routing_key=created": `URL parameter "routing_key" is for a sink; a source URL does not take it`,
	}
	for raw, want := range sourceBad {
		if _, err := ConfigFromURL(parse(raw)); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "pa55") {
			t.Errorf("source %s: error %v, want one containing %q (and no password)", raw, err, want)
		}
	}
	// The topology parameters shape what a sink with declare=true declares.
	if _, decl, err := SinkConfigFromURL(parse("amqp://user:pa55@broker/orders?declare=true&tiers=1s,1m&queue_type=quorum&dlq=orders.dead")); err != nil || decl == nil || len(decl.DelayTiers) != 2 || decl.QueueType != Quorum || decl.DeadLetterQueue != "orders.dead" {
		t.Errorf("sink with declare=true: %+v, %v", decl, err)
	}
}
