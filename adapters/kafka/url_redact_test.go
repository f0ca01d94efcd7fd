package kafka

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// TestURLTLSFilesBounded: a tls_ca, tls_cert or tls_key naming something
// other than a regular file (a device such as /dev/zero, a directory) or a
// file over maxPEMBytes is refused at once, naming the parameter. Before,
// tls_ca=/dev/zero read until memory ran out.
func TestURLTLSFilesBounded(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.pem")
	if err := os.WriteFile(big, make([]byte, 1<<20+1), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"tls_ca=/dev/zero", "tls_ca=" + t.TempDir(), "tls_ca=" + big,
		"tls_cert=/dev/zero&tls_key=/dev/zero", "tls_cert=" + big + "&tls_key=" + big,
	} {
		u, err := url.Parse("kafka://h:9092/t?" + q)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := ParseURL(u); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "tls_") {
				t.Errorf("%s: %v, want refused naming the parameter", q, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: still reading after 10s", q)
		}
	}
}
