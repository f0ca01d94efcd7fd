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
