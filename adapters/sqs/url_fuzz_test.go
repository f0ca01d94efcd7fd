package sqs

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise/adapters/internal/urlparam"
)

// FuzzParseURL: the awssqs:// URL parser never panics and never shows a
// password. Each input is a URL "awssqs://" + user + ":" + pass + "@" +
// rest whose password holds the marker S3CRET: wherever url.Parse puts it
// (the user info, which the parser refuses; or, cut short by an unescaped
// '/', '?' or '#', the host, path, query or fragment), no error shows it.
// Every error is an urlparam error. A URL a source takes names an https
// queue URL with a valid queue name, a dead-letter queue other than it,
// and bounds the adapter's Config accepts; a sink takes the same URL less
// the source parameters.
func FuzzParseURL(f *testing.F) {
	for _, s := range [][3]string{
		{"u", "12345?", "h/1/q"},
		{"u", "12345/", "h/1/q?dlq=d"},
		{"u", "12345#", "h/1/q"},
		{"", "", "sqs.us-east-2.amazonaws.com/99999/my-queue?region=us-east-2"},
		{"u", "p", "127.0.0.1:9324/1/q?endpoint=http://127.0.0.1:9324&wait=1s&visibility=30s"},
		{"u", "p", "h/1/q?endpoint=http://a%40b@h"},
		{"u", "p", "h/1/q?dlq=https://x:y%40z@h/1/d"},
		{"u", "p", "h/1/q.fifo?dlq=q.fifo"},
		{"u", "p", "h/1/q?wait=1500ms&ack_linger=-1"},
		{"u", "p", "h/?region=x"},
		{"u", "p", "h/1/q?visibility=13h"},
		{"u", "p", "h/1/q;x?wait=-1"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, user, pass, rest string) {
		const marker = "S3CRET"
		if anyForm(marker, user) || anyForm(marker, rest) {
			return // the marker is also outside the password
		}
		pass += marker
		for _, raw := range []string{"awssqs://" + user + ":" + pass + "@" + rest, "awssqs://" + rest} {
			u, err := url.Parse(raw)
			if err != nil {
				continue // the opener refuses it with a fixed message (adapters.lookup)
			}
			cfg, err := ConfigFromURL(u)
			_, serr := SinkConfigFromURL(u)
			for _, e := range []error{err, serr} {
				if e == nil {
					continue
				}
				if !errors.Is(e, urlparam.ErrParam) {
					t.Fatalf("%q: %v, not an urlparam error", raw, e)
				}
				if strings.Contains(e.Error(), marker) {
					t.Fatalf("%q: the error shows the password: %v", raw, e)
				}
			}
			if err != nil {
				continue
			}
			if strings.Contains(raw, marker) {
				t.Fatalf("%q: taken with user info", raw)
			}
			if err := cfg.validate(); err != nil {
				t.Fatalf("%q: taken, but Config refused: %v", raw, err)
			}
			if cfg.WaitTime > time.Duration(0) && cfg.WaitTime%time.Second != 0 {
				t.Fatalf("%q: wait %v", raw, cfg.WaitTime)
			}
			if !strings.HasPrefix(cfg.QueueURL, "https://") || queueNameProblem(queueName(cfg.QueueURL)) != "" {
				t.Fatalf("%q: queue URL %q", raw, cfg.QueueURL)
			}
		}
	})
}

// anyForm reports whether s holds marker as it is, path-unescaped or
// query-unescaped.
func anyForm(marker, s string) bool {
	p, _ := url.PathUnescape(s)
	q, _ := url.QueryUnescape(s)
	return strings.Contains(s, marker) || strings.Contains(p, marker) || strings.Contains(q, marker)
}
