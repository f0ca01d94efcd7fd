package rabbitmq

import "testing"

// TestURLParametersDocumented: docs/rabbitmq.md holds the table of the URL
// parameters as the parser's table gives it.
func TestURLParametersDocumented(t *testing.T) {
	if err := params.DocumentedIn("../../docs/rabbitmq.md"); err != nil {
		t.Error(err)
	}
}
