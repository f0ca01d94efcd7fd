package memory

import "testing"

// TestURLParametersDocumented: docs/adapters.md holds the table of the URL
// parameters as the parser's table gives it.
func TestURLParametersDocumented(t *testing.T) {
	if err := params.DocumentedIn("../../docs/adapters.md"); err != nil {
		t.Error(err)
	}
}
