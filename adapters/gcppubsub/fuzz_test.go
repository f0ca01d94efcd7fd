package gcppubsub

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/ackwise/ackwise/adapters"
)

// FuzzParseURL: ConfigFromURL and SinkConfigFromURL read any URL without
// panicking; an error matches adapters.ErrBadURL and shows no part of a
// password the URL holds (in its user info, or cut short into its host,
// path or query); a URL taken names a project and a subscription or topic
// without '/', and a source config that validates.
func FuzzParseURL(f *testing.F) {
	f.Add("", "", "projects/p/subscriptions/s?dead_letter_topic=d", false)
	f.Add("", "", "projects/p/topics/t?emulator=localhost:8085", true)
	f.Add("me", "pw", "projects/p/topics/t", true)
	f.Add("me", "a/b?c", "projects/p/subscriptions/s?dead_letter_topic=projects/q/topics/d&ack_deadline=10s", false)
	f.Add("", "", "projects/p/subscriptions/s?dead_letter_topic=d&max_outstanding=99999999999&max_extension=-1s", false)
	f.Add("", "", "projects/p/subscriptions/s?dead_letter_topic=d;endpoint=x", false)
	f.Add("u", "p#q", "projects/p/topics/t?endpoint=a:1&emulator=b:2", true)
	f.Fuzz(func(t *testing.T, user, pass, rest string, sink bool) {
		const a, b = "Pw1q", "Qx7K" // tokens no error text holds
		for _, s := range []string{user, pass, rest} {
			if strings.Contains(s, a[:2]) || strings.Contains(s, b[:2]) {
				return
			}
		}
		raw := "gcppubsub://" + rest
		secret := ""
		if user != "" || pass != "" {
			half := len(pass) / 2
			secret = a + pass[:half] + b + pass[half:]
			raw = "gcppubsub://" + user + ":" + secret + "@" + rest
		}
		u, err := url.Parse(raw)
		if err != nil {
			return // adapters.Open refuses it without showing it
		}
		leaks := func(err error) bool {
			return secret != "" && (strings.Contains(err.Error(), a) || strings.Contains(err.Error(), b))
		}
		if sink {
			cfg, err := SinkConfigFromURL(u)
			if err != nil {
				if !errors.Is(err, adapters.ErrBadURL) || leaks(err) {
					t.Fatalf("%q: %v", raw, err)
				}
				return
			}
			if cfg.Project == "" || cfg.Topic == "" || strings.Contains(cfg.Project+cfg.Topic, "/") || cfg.Endpoint != "" && cfg.Emulator != "" {
				t.Fatalf("%q: taken as %+v", raw, cfg)
			}
			return
		}
		cfg, err := ConfigFromURL(u)
		if err != nil {
			if !errors.Is(err, adapters.ErrBadURL) || leaks(err) {
				t.Fatalf("%q: %v", raw, err)
			}
			return
		}
		if strings.Contains(cfg.Project+cfg.Subscription, "/") {
			t.Fatalf("%q: taken as %+v", raw, cfg)
		}
		if err := cfg.validate(); err != nil {
			t.Fatalf("%q: taken, but its config does not validate: %v", raw, err)
		}
	})
}
