//go:build unix

package kafka

import (
	"net/url"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestURLTLSFileFIFO: a tls_ca naming a named pipe is refused at once.
// Before, opening it waited for a writer, for ever.
func TestURLTLSFileFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "ca.pem")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse("kafka://h:9092/t?tls_ca=" + url.QueryEscape(fifo))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := ParseURL(u); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "tls_ca") {
			t.Fatalf("%v, want refused naming tls_ca", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still opening the pipe after 10s")
	}
}
