package adapters_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/ackwise/ackwise/adapters"
)

func init() {
	// Registered once per test binary: Register panics on a second call, as
	// with -count=2.
	adapters.Register("openertest", adapters.Opener{
		OpenSink: func(ctx context.Context, u *url.URL) (adapters.Sink, error) {
			return nil, errors.New("sink " + u.Host)
		},
	})
}

func TestOpenerErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if _, err := adapters.OpenSource(ctx, "nosuch://x/y"); !errors.Is(err, adapters.ErrUnknownScheme) {
		t.Fatalf("unknown scheme: %v", err)
	}
	if _, err := adapters.OpenSource(ctx, "nosuch://user:hunter2@host/q"); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error leaks the password: %v", err)
	}
	if _, err := adapters.OpenSource(ctx, "://bad"); err == nil || !strings.Contains(err.Error(), "malformed URL") {
		t.Fatalf("malformed URL: %v", err)
	}
	if _, err := adapters.OpenSource(ctx, "amqp://guest:s3cret@host:%zz/q"); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("malformed URL error leaks the password: %v", err)
	}
	if _, err := adapters.OpenSource(ctx, "orders"); err == nil || !strings.Contains(err.Error(), "no scheme") {
		t.Fatalf("no scheme: %v", err)
	}
	if _, err := adapters.OpenSource(ctx, "openertest://h/q"); err == nil || !strings.Contains(err.Error(), "cannot open a source") {
		t.Fatalf("sink-only scheme: %v", err)
	}
	if _, err := adapters.OpenSink(ctx, "OPENERTEST://h/q"); err == nil || err.Error() != "sink h" {
		t.Fatalf("scheme lookup is case-insensitive: %v", err)
	}
}

// A password holding '/', '?' or '#' unescaped, or a URL without "scheme://",
// makes url.Parse put the password outside the user info, where
// URL.Redacted does not hide it. The opener's errors must not echo it.
func TestOpenerErrorsHideMisplacedPassword(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, raw := range []string{
		"guest:hunter2@localhost:5672/orders", // no "amqp://": "guest" is the scheme
		"nosuch://guest:1234/hunter2@host/q",  // '/' in the password: the rest is the path
		"nosuch://guest:1234?hunter2@host/q",  // '?': the rest is the query
		"nosuch://guest:1234#hunter2@host/q",  // '#': the rest is the fragment
		"guest/x:hunter2@host",                // no scheme at all
	} {
		for name, open := range map[string]func() error{
			"source": func() error { _, err := adapters.OpenSource(ctx, raw); return err },
			"sink":   func() error { _, err := adapters.OpenSink(ctx, raw); return err },
		} {
			if err := open(); err == nil || strings.Contains(err.Error(), "hunter2") {
				t.Errorf("%s %q: error leaks the password: %v", name, raw, err)
			}
		}
	}
}
