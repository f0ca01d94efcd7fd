package rabbitmq

import (
	"context"
	"strings"
	"testing"

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
