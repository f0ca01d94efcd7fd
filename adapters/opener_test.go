package adapters_test

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/ackwise/ackwise/adapters"
)

func init() {
	// Registered once per test binary: Register panics on a second call, as
	// with -count=2.
	adapters.Register("openertest", adapters.Opener{
		OpenSink: func(ctx context.Context, u *url.URL, _ adapters.OpenOptions) (adapters.Sink, error) {
			return nil, errors.New("sink " + u.Host)
		},
	})
	adapters.Register("optionstest", adapters.Opener{
		OpenSource: func(ctx context.Context, u *url.URL, o adapters.OpenOptions) (adapters.Source, error) {
			return nil, &gotOptions{o}
		},
	})
}

// gotOptions carries the options an opener got out through its error.
type gotOptions struct{ o adapters.OpenOptions }

func (*gotOptions) Error() string { return "got options" }

type ownKey struct{}
type otherKey struct{}

func TestOpenOptionsReachTheOpener(t *testing.T) {
	t.Parallel()
	l := slog.New(slog.DiscardHandler)
	mp := metricnoop.NewMeterProvider()
	tp := tracenoop.NewTracerProvider()
	tc := &tls.Config{ServerName: "broker"}
	_, err := adapters.OpenSource(context.Background(), "optionstest://h/q",
		adapters.WithLogger(slog.Default()), adapters.WithLogger(l), nil,
		adapters.WithMeterProvider(mp), adapters.WithTracerProvider(tp), adapters.WithTLSConfig(tc),
		adapters.WithAdapterOption(ownKey{}, 1), adapters.WithAdapterOption(ownKey{}, 2))
	var got *gotOptions
	if !errors.As(err, &got) {
		t.Fatalf("OpenSource: %v", err)
	}
	o := got.o
	if o.Logger != l || o.MeterProvider != mp || o.TracerProvider != tp || o.TLS != tc {
		t.Errorf("options %+v: the last of each, as given", o)
	}
	if v, ok := o.AdapterOption(ownKey{}); !ok || v != 2 {
		t.Errorf("AdapterOption(ownKey{}) = %v, %v; want the later value 2", v, ok)
	}
	if v, ok := o.AdapterOption(otherKey{}); ok {
		t.Errorf("AdapterOption(otherKey{}) = %v, %v; want none", v, ok)
	}
	if err := o.CheckAdapterOptions("demo", ownKey{}); err != nil {
		t.Errorf("CheckAdapterOptions with the key known: %v", err)
	}
	err = o.CheckAdapterOptions("demo", otherKey{})
	if want := "demo: adapter option adapters_test.ownKey: open option not supported: not one of demo's (an option of another adapter?)"; !errors.Is(err, adapters.ErrUnsupportedOption) || err.Error() != want {
		t.Errorf("CheckAdapterOptions with the key unknown: %v, want %s", err, want)
	}
	if err := adapters.UnsupportedOption("demo", "WithTLSConfig", "no network"); !errors.Is(err, adapters.ErrUnsupportedOption) || err.Error() != "demo: WithTLSConfig: open option not supported: no network" {
		t.Errorf("UnsupportedOption: %v", err)
	}
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
