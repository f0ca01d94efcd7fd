package rabbitmq

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise/adapters"
)

// A password with an unescaped '/', '?' or '#' lands outside the user info,
// where URL.Redacted shows it; the URL errors must still hide it.
func TestURLErrorsHideMisplacedPassword(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, raw := range []string{
		"amqp://guest:1234/hunter2@localhost:5672/orders?bogus=1", // path
		"amqp://guest:1234?hunter2@localhost:5672/orders",         // query (an unknown parameter named after it)
		"amqp://guest:1234#hunter2@localhost:5672/orders",         // fragment, no queue
	} {
		if _, err := adapters.OpenSource(ctx, raw); err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("source %q: error leaks the password: %v", raw, err)
		}
		if _, err := adapters.OpenSink(ctx, raw); err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("sink %q: error leaks the password: %v", raw, err)
		}
	}
}

// The same for a URL given in Config.URL or SinkConfig.URL rather than
// through the opener: newConn's redacted form (in every connect error)
// must not show it, and such a URL is not dialled.
func TestConfigURLErrorsHideMisplacedPassword(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, raw := range []string{
		"amqp://guest:1234/hunter2@127.0.0.1:5672/", // path
		"amqp://guest:1234?hunter2@127.0.0.1:5672/", // query
		"amqp://guest:1234#hunter2@127.0.0.1:5672/", // fragment
	} {
		if _, err := NewSource(ctx, Config{URL: raw, Queue: "orders"}); err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("source %q: error leaks the password: %v", raw, err)
		}
		if _, err := NewSink(ctx, SinkConfig{URL: raw, RoutingKey: "orders"}); err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("sink %q: error leaks the password: %v", raw, err)
		}
	}
}

// A password holding an unescaped '@' and then a '/', '?' or '#' leaves user
// info behind (the part before its '@'), so the URL has user info and an '@'
// after its host: the rest of the password is in the path, query or
// fragment, and the part between the two '@' is taken for the host. Such a
// URL is refused before it is dialled (a dial would look the fragment up as
// a host name, and its error names it), and the error shows none of it.
func TestURLWithUserAndAtAfterHostRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, raw := range []string{
		"amqp://guest:S3CR@hunter/two@127.0.0.1:5672/orders", // path
		"amqp://guest:S3CR@hunter?two@127.0.0.1:5672/orders", // query
		"amqp://guest:S3CR@hunter#two@127.0.0.1:5672/orders", // fragment
	} {
		leaks := func(err error) bool {
			return err == nil || strings.Contains(err.Error(), "hunter") || strings.Contains(err.Error(), "two")
		}
		if _, err := adapters.OpenSource(ctx, raw); leaks(err) {
			t.Errorf("OpenSource %q: %v", raw, err)
		}
		if _, err := adapters.OpenSink(ctx, raw); leaks(err) {
			t.Errorf("OpenSink %q: %v", raw, err)
		}
		if _, err := NewSource(ctx, Config{URL: raw, Queue: "orders"}); leaks(err) {
			t.Errorf("NewSource with URL %q: %v", raw, err)
		}
		if _, err := NewSink(ctx, SinkConfig{URL: raw, RoutingKey: "orders"}); leaks(err) {
			t.Errorf("NewSink with URL %q: %v", raw, err)
		}
	}
}
