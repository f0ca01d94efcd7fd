package rabbitmq

import (
	"os"
	"strings"
	"testing"
)

// TestURLParametersDocumented: docs/rabbitmq.md holds the table of the
// RabbitMQ URL parameters as the parser's table gives it.
func TestURLParametersDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/rabbitmq.md")
	if err != nil {
		t.Fatal(err)
	}
	if md := params.Markdown(); !strings.Contains(string(doc), md) {
		t.Errorf("docs/rabbitmq.md lacks the table of RabbitMQ URL parameters:\n%s", md)
	}
}
