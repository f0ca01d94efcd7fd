package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ackwise/ackwise"
)

// RunnerConfig configures a Runner. The zero value is valid: stop on
// SIGINT or SIGTERM, drain bounded by each consumer's own DrainTimeout.
type RunnerConfig struct {
	// DrainTimeout bounds how long Run waits, once it stops, for every
	// consumer's Run to return; past it Run returns an error wrapping
	// ErrDrainTimeout that names the consumers still draining (they go on
	// draining in the background). Zero means no bound of the Runner's
	// own: each consumer's Config.DrainTimeout (default 30s, then a short
	// grace) bounds its drain. Negative is invalid.
	DrainTimeout time.Duration
	// IgnoreSignals makes Run stop only when its context ends or a
	// consumer stops. By default SIGINT and SIGTERM stop it too
	// (signal.NotifyContext, until the drain begins: a second signal while
	// draining has its default action and ends the process at once).
	IgnoreSignals bool
	// Logger receives a line when a consumer stops on its own and when the
	// drain deadline passes. Default: discard.
	Logger *slog.Logger
	// Metrics, when set, is what Handler serves at /metrics: typically
	// promhttp.HandlerFor over the registry of the OpenTelemetry Prometheus
	// exporter (go.opentelemetry.io/otel/exporters/prometheus) that the
	// consumers' Observer (NewMetrics) records to, so that one port serves
	// the probes and the scrape. It is served as it is, whatever the
	// Runner's phase. Nil means /metrics is 404: ackwise depends on no
	// exporter of its own.
	Metrics http.Handler
}

// Runner runs several consumers with one lifecycle, as a service with more
// than one queue or topic needs: Run starts them all; SIGINT, SIGTERM or
// the end of Run's context drains them all; the first consumer to stop on
// its own (its source closed, an error) stops the others, and its error
// is what Run returns. Handler serves liveness and readiness probes.
//
// A Runner runs once. It does not close the consumers' sources: close
// them after Run returned. Ready and Handler are safe for concurrent use
// with Run.
type Runner struct {
	cfg       RunnerConfig
	consumers []*Consumer
	log       *slog.Logger

	mu     sync.Mutex
	phase  runnerPhase
	states []consumerState // by consumer
}

// consumerState is where one consumer of a Runner is.
type consumerState int

const (
	consumerWaiting consumerState = iota // Run not called yet
	consumerRunning                      // its Run was called and has not returned
	consumerStopped                      // its Run returned
)

func (s consumerState) String() string {
	return [...]string{"waiting", "running", "stopped"}[s]
}

type runnerPhase int

const (
	phaseIdle runnerPhase = iota
	phaseRunning
	phaseDraining
	phaseStopped
)

func (p runnerPhase) String() string {
	return [...]string{"idle", "running", "draining", "stopped"}[p]
}

// errStopped is a consumer's Run that returned nil before the Runner
// stopped it.
var errStopped = errors.New("consumer: Run returned before the runner stopped it")

// NewRunner returns a Runner for consumers, which must be at least one,
// none nil, none given twice, with distinct Config.Name (the probes and
// errors name them).
func NewRunner(cfg RunnerConfig, consumers ...*Consumer) (*Runner, error) {
	if cfg.DrainTimeout < 0 {
		return nil, fmt.Errorf("consumer: RunnerConfig.DrainTimeout = %v: must not be negative (0 means each consumer's own Config.DrainTimeout)", cfg.DrainTimeout)
	}
	if len(consumers) == 0 {
		return nil, errors.New("consumer: NewRunner: no consumers")
	}
	names := map[string]bool{}
	for i, c := range consumers {
		if c == nil {
			return nil, fmt.Errorf("consumer: NewRunner: consumer %d is nil", i)
		}
		if names[c.cfg.Name] {
			return nil, fmt.Errorf("consumer: NewRunner: two consumers are named %q: give each its own Config.Name", c.cfg.Name)
		}
		names[c.cfg.Name] = true
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Runner{cfg: cfg, consumers: slices.Clone(consumers), log: log, states: make([]consumerState, len(consumers))}, nil
}

// Run runs every consumer until ctx ends, SIGINT or SIGTERM arrives (unless
// IgnoreSignals), or a consumer's Run returns on its own; then it cancels
// the others' context, so that each drains (Consumer.Run), and waits for
// them, up to DrainTimeout when set. It returns nil after a clean stop;
// else the error of the consumer that stopped first (named), joined with
// the drain errors of the others (ErrDrainTimeout). It returns ErrRunning
// when called a second time.
func (r *Runner) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.phase != phaseIdle {
		r.mu.Unlock()
		return ErrRunning
	}
	r.phase = phaseRunning
	r.mu.Unlock()
	stopSignals := func() {}
	if !r.cfg.IgnoreSignals {
		ctx, stopSignals = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stopSignals()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	type result struct {
		i   int
		err error
	}
	done := make(chan result, len(r.consumers))
	for i, c := range r.consumers {
		r.setState(i, consumerRunning)
		go func() { done <- result{i, c.Run(ctx)} }()
	}
	left := len(r.consumers)
	var first error
	select {
	case <-ctx.Done():
	case res := <-done:
		left--
		r.setState(res.i, consumerStopped)
		first = fmt.Errorf("consumer %q stopped: %w", r.consumers[res.i].cfg.Name, cmp.Or(res.err, errStopped))
		r.log.Error("consumer stopped; stopping the others", slog.String(ackwise.LogKeyConsumer, r.consumers[res.i].cfg.Name), slog.Any(ackwise.LogKeyError, first))
	}
	r.setPhase(phaseDraining)
	cancel()
	// A second signal while draining gets its default action: an operator
	// who presses ^C twice ends the process at once.
	stopSignals()

	var deadline <-chan time.Time
	if r.cfg.DrainTimeout > 0 {
		t := time.NewTimer(r.cfg.DrainTimeout)
		defer t.Stop()
		deadline = t.C
	}
	errs := []error{first}
	for left > 0 {
		select {
		case res := <-done:
			left--
			r.setState(res.i, consumerStopped)
			if res.err != nil {
				errs = append(errs, fmt.Errorf("consumer %q: %w", r.consumers[res.i].cfg.Name, res.err))
			}
		case <-deadline:
			still := r.stillRunning()
			r.log.Warn("runner drain deadline passed", slog.Duration(ackwise.LogKeyTimeout, r.cfg.DrainTimeout), slog.String(ackwise.LogKeyConsumer, strings.Join(still, ",")))
			errs = append(errs, fmt.Errorf("%w: after %v, still draining: %s", ErrDrainTimeout, r.cfg.DrainTimeout, strings.Join(still, ", ")))
			left = 0
		}
	}
	r.setPhase(phaseStopped)
	return errors.Join(errs...)
}

func (r *Runner) setPhase(p runnerPhase) {
	r.mu.Lock()
	r.phase = p
	r.mu.Unlock()
}

func (r *Runner) setState(i int, s consumerState) {
	r.mu.Lock()
	r.states[i] = s
	r.mu.Unlock()
}

func (r *Runner) stillRunning() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var names []string
	for i, s := range r.states {
		if s == consumerRunning {
			names = append(names, r.consumers[i].cfg.Name)
		}
	}
	return names
}

// Ready reports whether the Runner is running every consumer and not
// draining: what Handler's /readyz says.
func (r *Runner) Ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.readyLocked()
}

func (r *Runner) readyLocked() bool {
	if r.phase != phaseRunning {
		return false
	}
	for _, s := range r.states {
		if s != consumerRunning {
			return false
		}
	}
	return true
}

// Handler returns an http.Handler for liveness and readiness probes, and
// for RunnerConfig.Metrics when set. It answers a request whose path ends
// in /healthz, /readyz or /metrics (so it may be mounted under a prefix)
// and 404 otherwise:
//   - /healthz is 200 until Run has returned (draining included: a probe
//     that failed then would have the process killed mid-drain), 503 after;
//   - /readyz is 200 while every consumer runs and the Runner is not
//     draining, 503 before Run, while draining and after;
//   - /metrics is RunnerConfig.Metrics, served as it is (404 when nil).
//
// The body of a probe is the Runner's phase (idle, running, draining,
// stopped), then one line per consumer: its name and whether it is waiting
// (Run not called yet), running or stopped. It is safe for concurrent use.
// The engine reports metrics through OpenTelemetry (Config.Observer,
// docs/observability.md); /metrics serves them only through the exporter
// handler the application sets in RunnerConfig.Metrics.
func (r *Runner) Handler() http.Handler {
	return http.HandlerFunc(r.serveProbe)
}

func (r *Runner) serveProbe(w http.ResponseWriter, req *http.Request) {
	base := path.Base(req.URL.Path)
	if base == "metrics" && r.cfg.Metrics != nil {
		r.cfg.Metrics.ServeHTTP(w, req)
		return
	}
	r.mu.Lock()
	var ok bool
	switch base {
	case "healthz":
		ok = r.phase != phaseStopped
	case "readyz":
		ok = r.readyLocked()
	default:
		r.mu.Unlock()
		http.NotFound(w, req)
		return
	}
	var b strings.Builder
	b.WriteString(r.phase.String() + "\n")
	for i, c := range r.consumers {
		fmt.Fprintf(&b, "%s %s\n", c.cfg.Name, r.states[i])
	}
	r.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = io.WriteString(w, b.String())
}
