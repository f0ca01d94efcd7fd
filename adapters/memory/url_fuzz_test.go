package memory

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/internal/urlparam"
)

// FuzzParseURL: the mem:// URL parser never panics and never shows a
// password. Each input is a URL "mem://" + user + ":" + pass + "@" + rest
// whose password holds the marker S3CRET: wherever url.Parse puts the
// password (the user info, or, cut short by an unescaped '/', '?' or '#',
// the host, path, query or fragment), no error shows the marker. A URL it
// accepts names a destination. Every error is an urlparam error.
func FuzzParseURL(f *testing.F) {
	for _, s := range [][3]string{
		{"u", "12345?", "q"},
		{"u", "12345?", "q?lease=1s"},
		{"u", "12345/", "q"},
		{"u", "12345#", "q"},
		{"u", "", "q?colour=blue"},
		{"u", "x", "/?lease=1s"},
		{"u", "x", "q?partitions=2&lease=1s"},
		{"", "", ""},
		{"u@h", "p", "q"},
		{"u", "p?a=b&", "q?dlq="},
		{"u", "%zz", "q"},
		{"u", "p", "q?%zz"},
		{"u", "p", "q?lease=1s&lease=2s"},
		{"u", "p", "orders?max_receives=-1"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, user, pass, rest string) {
		const marker = "S3CRET"
		pass += marker
		for _, part := range []string{user, rest} {
			for _, form := range []string{part, unescapeOr(url.PathUnescape, part), unescapeOr(url.QueryUnescape, part)} {
				if strings.Contains(form, marker) {
					return // the marker is also outside the password
				}
			}
		}
		raw := "mem://" + user + ":" + pass + "@" + rest
		u, err := url.Parse(raw)
		if err != nil {
			return // the opener refuses it with a fixed message (adapters.lookup)
		}
		tg, err := parseURL(u, urlparam.Source)
		if _, err2 := parseURL(u, urlparam.Sink); (err == nil) != (err2 == nil) {
			t.Fatalf("parseURL(%q): source %v, sink %v: every mem parameter is for both", raw, err, err2)
		}
		if err != nil {
			if !errors.Is(err, urlparam.ErrParam) {
				t.Fatalf("parseURL(%q) = %v, not an urlparam error", raw, err)
			}
			if strings.Contains(err.Error(), marker) {
				t.Fatalf("parseURL(%q): error %q shows the password", raw, err)
			}
			if adapters.MisplacedUserInfo(u) && !errors.Is(err, adapters.ErrMisplacedUserInfo) {
				t.Fatalf("parseURL(%q) = %v: a password cut short is refused as such", raw, err)
			}
			return
		}
		if adapters.MisplacedUserInfo(u) {
			t.Fatalf("parseURL(%q) accepted a URL whose password was cut short", raw)
		}
		if tg.name == "" || strings.Contains(tg.name, marker) {
			t.Fatalf("parseURL(%q) names %q", raw, tg.name)
		}
	})
}

func unescapeOr(f func(string) (string, error), s string) string {
	if u, err := f(s); err == nil {
		return u
	}
	return s
}
