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

// A password holding an unescaped '@' and then a '?' or '#' leaves user
// info behind (the part before its '@'), so the URL has user info and an
// '@' in its query or fragment, where the rest of the password is: refused,
// and the error shows none of it (before, an unknown parameter named by it
// was quoted).
func TestURLWithUserAndAtAfterHostNotShown(t *testing.T) {
	for _, raw := range []string{
		"kafka://alice:S3CR@hunter:9092/orders?two@h1:9092/orders&sasl=plain",
		"kafka://alice:S3CR@hunter:9092/orders?sasl=plain#two@h1:9092/orders",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		_, err = ParseURL(u)
		if err == nil || strings.Contains(err.Error(), "two") {
			t.Errorf("%s: %v", raw, err)
		}
	}
}
