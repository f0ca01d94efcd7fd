package adapters

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Opener opens sources and sinks for one URL scheme. Either function may be
// nil when the adapter offers only one side.
type Opener struct {
	OpenSource func(ctx context.Context, u *url.URL) (Source, error)
	OpenSink   func(ctx context.Context, u *url.URL) (Sink, error)
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
// "amqp://guest:guest@localhost:5672/orders". Errors never contain the URL's
// password.
func OpenSource(ctx context.Context, rawURL string) (Source, error) {
	u, o, err := lookup(rawURL)
	if err != nil {
		return nil, err
	}
	if o.OpenSource == nil {
		return nil, fmt.Errorf("adapters: scheme %q cannot open a source", u.Scheme)
	}
	return o.OpenSource(ctx, u)
}

// OpenSink opens a sink by URL. Errors never contain the URL's password.
func OpenSink(ctx context.Context, rawURL string) (Sink, error) {
	u, o, err := lookup(rawURL)
	if err != nil {
		return nil, err
	}
	if o.OpenSink == nil {
		return nil, fmt.Errorf("adapters: scheme %q cannot open a sink", u.Scheme)
	}
	return o.OpenSink(ctx, u)
}
