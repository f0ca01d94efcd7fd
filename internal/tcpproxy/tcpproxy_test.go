package tcpproxy

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// echo starts a TCP server on loopback that writes back what it reads,
// closed with its connections when t ends.
func echo(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { _, _ = io.Copy(c, c); c.Close() })
		}
	})
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return l.Addr().String()
}

// roundTrip writes a byte to c and reads it back, with a generous
// deadline: a cut connection fails at once, a hung one at the deadline.
func roundTrip(c net.Conn) error {
	if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return err
	}
	if _, err := c.Write([]byte{'x'}); err != nil {
		return err
	}
	_, err := io.ReadFull(c, make([]byte, 1))
	return err
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// try dials addr and makes a round trip on a new connection. A proxy that
// resets the connection as it comes may do so before the dial returns.
func try(addr string) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return roundTrip(c)
}

// TestProxyCutRestore checks that the proxy forwards, that Cut fails the
// open connection and each new one (counting the new ones in Refused),
// that Restore forwards again, and that Close stops the listener.
func TestProxyCutRestore(t *testing.T) {
	p := Start(t, echo(t))
	open := dial(t, p.Addr())
	if err := roundTrip(open); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}

	p.Cut()
	if err := roundTrip(open); err == nil || isTimeout(err) {
		t.Fatalf("open connection after Cut: %v, want reset", err)
	}
	for i := range 2 {
		if err := try(p.Addr()); err == nil || isTimeout(err) {
			t.Fatalf("new connection %d while cut: %v, want reset", i, err)
		}
	}
	if n := p.Refused(); n != 2 {
		t.Fatalf("Refused() = %d after 2 connections while cut, want 2", n)
	}

	p.Restore()
	if err := try(p.Addr()); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
	if n := p.Refused(); n != 2 {
		t.Fatalf("Refused() = %d after Restore, want still 2", n)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", p.Addr()); err == nil {
		c.Close()
		t.Fatal("dialled the proxy after Close")
	}
}

// TestProxyTargetDown checks that a connection the proxy cannot forward
// fails instead of hanging.
func TestProxyTargetDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := Start(t, l.Addr().String())
	l.Close() // after Start: the proxy's own port cannot be the closed one
	if err := try(p.Addr()); err == nil || isTimeout(err) {
		t.Fatalf("through a proxy to a closed port: %v, want a failure", err)
	}
	if n := p.Refused(); n != 0 {
		t.Fatalf("Refused() = %d when not cut, want 0", n)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
