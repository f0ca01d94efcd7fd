package ops

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/ackwise/ackwise"
)

// Server is the worker's HTTP server: the Runner's /healthz, /readyz and
// /metrics.
type Server struct {
	// Addr is the address it listens on (the port chosen, for ":0").
	Addr string
	srv  *http.Server
	done chan struct{}
}

// Serve listens on addr and serves h in the background until Close.
func Serve(addr string, h http.Handler, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{
		Addr: ln.Addr().String(),
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)},
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", slog.Any(ackwise.LogKeyError, err))
		}
	}()
	return s, nil
}

// Close stops the server, letting requests in progress finish until ctx
// ends.
func (s *Server) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	<-s.done
	return err
}
