package kafka

import (
	"net/url"
	"strings"
	"testing"
)

// A password with an unescaped '/', '?' or '#' ends the user info early and
// lands in the path, query or fragment: such a URL is refused, and the error
// does not show it.
func TestURLMisplacedPasswordNotShown(t *testing.T) {
	for _, raw := range []string{
		"kafka://alice:1234/hunter2@h1:9092/orders?group=g",
		"kafka://alice:1234?hunter2@h1:9092/orders?group=g",
		"kafka://alice:1234#hunter2@h1:9092/orders?group=g",
		"kafka://alice:1234?x=1&hunter2@h1:9092/orders",
	} {
		u, err := url.Parse(raw) // the user info ends at the '/', '?' or '#'
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		_, err = ParseURL(u)
		if err == nil {
			t.Errorf("%s: accepted", raw)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error shows the password: %v", err)
		}
	}
}
