package rabbitmq

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// A Config or SinkConfig printed or logged never shows its URL's password,
// whichever way it is printed, alone or inside another value.
func TestConfigPrintedWithoutPassword(t *testing.T) {
	t.Parallel()
	urls := map[string]string{
		"well formed":    "amqp://guest:s3cret@localhost:5672/vhost",
		"malformed":      "amqp://guest:s3cret%zz@localhost:5672/",
		"@ after host":   "amqp://guest:s3cret@hunter/two@localhost/",
		"query password": "amqp://localhost/?x=1@guest:s3cret",
	}
	for name, raw := range urls {
		values := map[string]any{
			"Config":     Config{URL: raw, Queue: "orders"},
			"SinkConfig": SinkConfig{URL: raw, Exchange: "orders"},
			"pointer":    &Config{URL: raw, Queue: "orders"},
			"nested":     struct{ Rabbit SinkConfig }{SinkConfig{URL: raw}},
		}
		for kind, v := range values {
			var out []string
			for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q"} {
				out = append(out, fmt.Sprintf(verb, v))
			}
			var text, js bytes.Buffer
			slog.New(slog.NewTextHandler(&text, nil)).Info("config", "cfg", v)
			slog.New(slog.NewJSONHandler(&js, nil)).Info("config", "cfg", v)
			out = append(out, text.String(), js.String())
			for _, s := range out {
				if strings.Contains(s, "s3cret") {
					t.Errorf("%s, %s: printed with the password: %s", name, kind, s)
				}
			}
		}
	}
	// What is shown: the fields, and the URL without its password.
	c := Config{URL: "amqp://guest:s3cret@localhost:5672/vhost", Queue: "orders"}
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%#v", c)} {
		if !strings.Contains(s, "amqp://guest:xxxxx@localhost:5672/vhost") || !strings.Contains(s, "orders") {
			t.Errorf("printed as %s", s)
		}
	}
	if s := fmt.Sprintf("%#v", c); !strings.HasPrefix(s, "rabbitmq.Config{") {
		t.Errorf("%%#v = %s", s)
	}
}
