package adapters

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Opener opens sources and sinks for one URL scheme. Either function may be
// nil when the adapter offers only one side. Each gets the options the
// caller of [OpenSource] or [OpenSink] gave, applied in order; it uses
// every one it is given or refuses it with an error wrapping
// [ErrUnsupportedOption] (see [OpenOptions]).
type Opener struct {
	OpenSource func(ctx context.Context, u *url.URL, o OpenOptions) (Source, error)
	OpenSink   func(ctx context.Context, u *url.URL, o OpenOptions) (Sink, error)
	// SourceParams lists the query parameters of a consumer's source URL
	// that a sink URL for the same destination leaves out (a consumer
	// group, a prefetch, the topology the consumer declares): [SinkURL]
	// drops them. nil: none.
	SourceParams []string
}

// OpenOptions are what a program passes to an adapter opened by URL
// besides the URL: what a URL cannot carry (a logger, telemetry
// providers, a *tls.Config) and adapter-specific values
// ([WithAdapterOption]). A nil field is not given.
//
// The rule for adapters: an option is used or refused, never ignored. An
// adapter given an option it cannot use (a TLS config for a broker without
// a network), or an adapter option whose key is not its own
// ([OpenOptions.CheckAdapterOptions]), fails to open with an error
// wrapping [ErrUnsupportedOption] that names the option. Each adapter's
// documentation says what it does with each option.
type OpenOptions struct {
	// Logger receives the adapter's log records (reconnections, warnings).
	Logger *slog.Logger
	// MeterProvider gives the adapter's meters.
	MeterProvider metric.MeterProvider
	// TracerProvider gives the adapter's tracers.
	TracerProvider trace.TracerProvider
	// TLS is the TLS configuration for the broker connection.
	TLS *tls.Config

	adapter []adapterOption // in the order given
}

type adapterOption struct{ key, value any }

// OpenOption sets a field of [OpenOptions].
type OpenOption func(*OpenOptions)

// WithLogger gives the adapter a logger.
func WithLogger(l *slog.Logger) OpenOption { return func(o *OpenOptions) { o.Logger = l } }

// WithMeterProvider gives the adapter a meter provider.
func WithMeterProvider(mp metric.MeterProvider) OpenOption {
	return func(o *OpenOptions) { o.MeterProvider = mp }
}

// WithTracerProvider gives the adapter a tracer provider.
func WithTracerProvider(tp trace.TracerProvider) OpenOption {
	return func(o *OpenOptions) { o.TracerProvider = tp }
}

// WithTLSConfig gives the adapter a TLS configuration for its broker
// connection. Each adapter's documentation says how it combines with the
// URL's TLS parameters.
func WithTLSConfig(c *tls.Config) OpenOption { return func(o *OpenOptions) { o.TLS = c } }

// WithAdapterOption gives one adapter a value of its own, under key: a
// value of an unexported type of the adapter's package, so that no other
// package can make it. Adapters wrap it in their own exported functions
// (for example an adapter's WithClientOptions); programs call those rather
// than this. A later option with the same key replaces an earlier one.
func WithAdapterOption(key, value any) OpenOption {
	return func(o *OpenOptions) {
		for i := range o.adapter {
			if o.adapter[i].key == key {
				o.adapter[i].value = value
				return
			}
		}
		o.adapter = append(o.adapter, adapterOption{key, value})
	}
}

// AdapterOption returns the value given under key with
// [WithAdapterOption], and whether one was.
func (o OpenOptions) AdapterOption(key any) (any, bool) {
	for _, a := range o.adapter {
		if a.key == key {
			return a.value, true
		}
	}
	return nil, false
}

// ErrUnsupportedOption is wrapped by the error of an adapter refusing an
// option it cannot use ([UnsupportedOption],
// [OpenOptions.CheckAdapterOptions]).
var ErrUnsupportedOption = errors.New("open option not supported")

// UnsupportedOption returns the error of adapter ("memory") refusing the
// option named option ("WithTLSConfig"), saying why: it wraps
// [ErrUnsupportedOption].
func UnsupportedOption(adapter, option, why string) error {
	return fmt.Errorf("%s: %s: %w: %s", adapter, option, ErrUnsupportedOption, why)
}

// CheckAdapterOptions returns an error wrapping [ErrUnsupportedOption] if
// o holds an adapter option ([WithAdapterOption]) whose key is none of
// known: one made for another adapter, which this one would otherwise
// ignore. The error names the key's type, which names its package.
func (o OpenOptions) CheckAdapterOptions(adapter string, known ...any) error {
	for _, a := range o.adapter {
		if !slices.Contains(known, a.key) {
			return UnsupportedOption(adapter, fmt.Sprintf("adapter option %T", a.key), "not one of "+adapter+"'s (an option of another adapter?)")
		}
	}
	return nil
}

func applyOptions(opts []OpenOption) OpenOptions {
	var o OpenOptions
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	return o
}

var (
	openersMu sync.RWMutex
	openers   = map[string]Opener{}
)

// Register makes an adapter available under scheme (for example "mem",
// "kafka", "amqp"). Adapter packages call it from init; importing the adapter
// package is what makes its scheme available. Registering a scheme twice
// panics, as registering a database/sql driver twice does: it is a programming
// error, not bad input.
func Register(scheme string, o Opener) {
	openersMu.Lock()
	defer openersMu.Unlock()
	scheme = strings.ToLower(scheme)
	if _, dup := openers[scheme]; dup {
		panic("adapters: Register called twice for scheme " + scheme)
	}
	openers[scheme] = o
}

// Schemes lists the registered schemes, sorted.
func Schemes() []string {
	openersMu.RLock()
	defer openersMu.RUnlock()
	s := make([]string, 0, len(openers))
	for k := range openers {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// ErrBadURL is matched (errors.Is) by the error of an adapter refusing a
// URL it cannot read: a malformed query, an unknown, repeated, empty or
// misplaced parameter (one only the other side uses), a bad value. Such an
// error names the adapter and the URL parameter.
var ErrBadURL = errors.New("bad URL")

// ErrUnknownScheme is returned (wrapped) for a URL whose scheme no imported
// adapter registered.
var ErrUnknownScheme = errors.New("adapters: unknown URL scheme")

// RedactURL returns u, quoted, for an error message or a log record, with
// its password hidden. URL.Redacted alone is not enough: a password holding
// an unescaped '/', '?' or '#', or a URL written without "scheme://"
// ("guest:secret@host/q"), makes url.Parse end the user info early and put
// the password in the path, query, fragment or opaque part, where Redacted
// shows it. Such a URL (one with '@' in any of those parts) is not shown.
func RedactURL(u *url.URL) string {
	if strings.Contains(u.Opaque, "@") || atAfterHost(u) {
		return "(not shown: it may hold a password; percent-encode special characters in the user name and password)"
	}
	return strconv.Quote(u.Redacted())
}

// MisplacedUserInfo reports whether u most likely had its user info cut
// short by an unescaped '/', '?' or '#' in the password, which url.Parse
// then put in the opaque part, path, query or fragment: an '@' in the
// opaque part, or one after the host, with or without user info (a
// password with an unescaped '@' before the '/', '?' or '#' leaves user
// info behind, its start, and the part up to the '/', '?' or '#' in the
// host). An adapter refuses such a URL, before it dials it, without
// showing it: a literal '@' after the host is written %40.
func MisplacedUserInfo(u *url.URL) bool {
	return strings.Contains(u.Opaque, "@") || atAfterHost(u)
}

// ErrMisplacedUserInfo is returned (wrapped) by [RefuseMisplacedUserInfo].
var ErrMisplacedUserInfo = errors.New("URL holds '@' after its host (not shown: it may hold a password with an unescaped '/', '?' or '#'; percent-encode it, and a literal '@' as %40)")

// RefuseMisplacedUserInfo returns an error wrapping [ErrMisplacedUserInfo],
// prefixed with adapter ("memory"), when u's user info most likely ended
// early ([MisplacedUserInfo]), and nil otherwise. The error shows no part
// of u: the host, path, query or fragment may now hold the password. An
// adapter calls it first in its URL parser, before any error that names a
// parameter or the destination.
func RefuseMisplacedUserInfo(adapter string, u *url.URL) error {
	if MisplacedUserInfo(u) {
		return fmt.Errorf("%s: %w", adapter, ErrMisplacedUserInfo)
	}
	return nil
}

// atAfterHost reports whether u's path, query or fragment holds an '@'.
func atAfterHost(u *url.URL) bool {
	return strings.Contains(u.EscapedPath(), "@") || strings.Contains(u.RawQuery, "@") || strings.Contains(u.EscapedFragment(), "@")
}

func lookup(rawURL string) (*url.URL, Opener, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// Neither the URL nor url.Parse's reason: both may quote part of a
		// password (an unescaped '#', '/' or '?' in it ends the user info
		// early, and the reason names the port or host it then sees).
		return nil, Opener{}, errors.New("adapters: malformed URL (not shown: it may hold credentials; percent-encode special characters in the user name and password)")
	}
	if u.Scheme == "" {
		return nil, Opener{}, fmt.Errorf("adapters: URL %s has no scheme (want one of %s)", RedactURL(u), strings.Join(Schemes(), ", "))
	}
	openersMu.RLock()
	o, ok := openers[strings.ToLower(u.Scheme)]
	openersMu.RUnlock()
	if !ok {
		return nil, Opener{}, fmt.Errorf("%w %q in %s (registered: %s; is the adapter package imported?)", ErrUnknownScheme, u.Scheme, RedactURL(u), strings.Join(Schemes(), ", "))
	}
	return u, o, nil
}

// OpenSource opens a source by URL, for example "mem://orders",
// "kafka://broker:9092/orders?group=billing" or
// "amqp://guest:guest@localhost:5672/orders", with the options given (a
// nil one is skipped; see [OpenOptions] for what adapters do with them).
// Errors never contain the URL's password.
func OpenSource(ctx context.Context, rawURL string, opts ...OpenOption) (Source, error) {
	u, o, err := lookup(rawURL)
	if err != nil {
		return nil, err
	}
	if o.OpenSource == nil {
		return nil, fmt.Errorf("adapters: scheme %q cannot open a source", u.Scheme)
	}
	return o.OpenSource(ctx, u, applyOptions(opts))
}

// OpenSink opens a sink by URL, with the options given, as [OpenSource]
// opens a source. Errors never contain the URL's password.
func OpenSink(ctx context.Context, rawURL string, opts ...OpenOption) (Sink, error) {
	u, o, err := lookup(rawURL)
	if err != nil {
		return nil, err
	}
	if o.OpenSink == nil {
		return nil, fmt.Errorf("adapters: scheme %q cannot open a sink", u.Scheme)
	}
	return o.OpenSink(ctx, u, applyOptions(opts))
}

// SinkURL returns rawURL without the query parameters its scheme's
// adapter takes for a source only ([Opener.SourceParams]), and the names of
// those it dropped: a consumer's own source URL
// ("kafka://broker:9092/orders?group=billing") becomes a sink URL for the
// same destination ("kafka://broker:9092/orders"), as the ackwise CLI
// takes a redrive target. The rest of the URL is kept as written.
func SinkURL(rawURL string) (sink string, dropped []string, err error) {
	u, o, err := lookup(rawURL)
	if err != nil {
		return "", nil, err
	}
	if u.RawQuery == "" || len(o.SourceParams) == 0 {
		return rawURL, nil, nil
	}
	var kept []string
	for _, kv := range strings.Split(u.RawQuery, "&") {
		k, _, _ := strings.Cut(kv, "=")
		if name, err := url.QueryUnescape(k); err == nil && slices.Contains(o.SourceParams, name) {
			if !slices.Contains(dropped, name) {
				dropped = append(dropped, name)
			}
			continue
		}
		kept = append(kept, kv)
	}
	if len(dropped) == 0 {
		return rawURL, nil, nil
	}
	u.RawQuery = strings.Join(kept, "&")
	u.ForceQuery = false
	return u.String(), dropped, nil
}
