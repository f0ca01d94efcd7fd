package memory

import (
	"os"
	"strings"
	"testing"
)

// TestURLParametersDocumented: docs/adapters.md holds the table of the
// mem:// parameters as the parser's table gives it.
func TestURLParametersDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/adapters.md")
	if err != nil {
		t.Fatal(err)
	}
	if md := params.Markdown(); !strings.Contains(string(doc), md) {
		t.Errorf("docs/adapters.md lacks the table of mem:// parameters:\n%s", md)
	}
}
