package gcppubsub

import "testing"

// TestURLParametersDocumented: docs/pubsub.md holds the table of the URL
// parameters as the parser's table gives it.
func TestURLParametersDocumented(t *testing.T) {
	if err := params.DocumentedIn("../../docs/pubsub.md"); err != nil {
		t.Error(err)
	}
}
