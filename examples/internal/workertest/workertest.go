// Package workertest holds what the worker examples' end-to-end tests
// share: a PostgreSQL schema of their own, starting a worker and finding
// its HTTP server, probing it and reading its Prometheus scrape.
package workertest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/examples/internal/ops"
	"github.com/ackwise/ackwise/examples/internal/orders"
	"github.com/ackwise/ackwise/examples/internal/worker"
)

// Wait bounds every wait of these helpers: generous, for a busy machine.
const Wait = 20 * time.Second

// Suffix returns a random suffix for a queue, topic or schema name.
func Suffix() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// PostgresURL is the database the tests use: ACKWISE_TEST_POSTGRES, else
// the machine's trust-auth server.
func PostgresURL() string {
	if u := os.Getenv("ACKWISE_TEST_POSTGRES"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// Schema returns a pool on PostgresURL and a schema name of the test's own,
// dropped with everything in it when the test ends. It fails the test when
// PostgreSQL cannot be reached.
func Schema(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, PostgresURL())
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		t.Fatalf("PostgreSQL unreachable (start it, or set ACKWISE_TEST_POSTGRES): %v", err)
	}
	schema := "ackwise_example_" + Suffix()
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
		pool.Close()
	})
	return pool, schema
}

// Options are the worker options of an end-to-end test: a PostgreSQL
// schema of its own (Schema), an HTTP port of its own, 4 attempts and 4
// handlers at once, no traces, n demo orders.
func Options(t *testing.T, n int) worker.Options {
	t.Helper()
	_, schema := Schema(t)
	return worker.Options{
		Attempts:    4,
		Concurrency: 4,
		Postgres:    PostgresURL(),
		Schema:      schema,
		Addr:        "127.0.0.1:0",
		Traces:      ops.TracesNone,
		Drain:       10 * time.Second,
		Demo:        n,
	}
}

// Result is what a worker's run returned.
type Result struct {
	Summary orders.Summary
	Err     error
}

// Worker is a worker started by Start.
type Worker struct {
	// Base is the URL of its HTTP server, http://host:port.
	Base string
	// Cancel cancels the worker's context: it drains and returns.
	Cancel context.CancelFunc

	stopped chan struct{} // closed when run returned
	result  Result
}

// Start runs run in a goroutine with a context the test cancels (Cancel;
// also when the test ends) and waits until it told its HTTP server's
// address. run must call listening once it serves.
func Start(t *testing.T, run func(ctx context.Context, listening func(addr string)) (orders.Summary, error)) *Worker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &Worker{Cancel: cancel, stopped: make(chan struct{})}
	addrs := make(chan string, 1)
	go func() {
		defer close(w.stopped)
		w.result.Summary, w.result.Err = run(ctx, func(addr string) { addrs <- addr })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-w.stopped:
		case <-time.After(Wait):
			t.Error("the worker did not stop")
		}
	})
	select {
	case addr := <-addrs:
		w.Base = "http://" + addr
	case <-w.stopped:
		t.Fatalf("the worker stopped before it served: %v", w.result.Err)
	case <-time.After(Wait):
		t.Fatal("the worker did not start serving")
	}
	return w
}

// Wait waits for the worker's run to return, and returns what it did.
func (w *Worker) Wait(t *testing.T) Result {
	t.Helper()
	select {
	case <-w.stopped:
		return w.result
	case <-time.After(Wait):
		t.Fatal("the worker did not stop")
		return Result{}
	}
}

// Get returns the status and body of GET url.
func Get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// AwaitStatus waits until GET url answers code.
func AwaitStatus(t *testing.T, url string, code int) {
	t.Helper()
	deadline := time.Now().Add(Wait)
	for {
		got, body := Get(t, url)
		if got == code {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s = %d %q, want %d", url, got, body, code)
		}
		time.Sleep(10 * time.Millisecond) // polling a probe, as an orchestrator does
	}
}

// Outcomes reads the scrape at url and returns the sum of
// ackwise_consumer_messages_total by ackwise_outcome label, and the scrape.
func Outcomes(t *testing.T, url string) (map[string]float64, string) {
	t.Helper()
	code, body := Get(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s = %d %q", url, code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("GET %s: not the Prometheus text format: %v\n%s", url, err, body)
	}
	out := map[string]float64{}
	if f := families["ackwise_consumer_messages_total"]; f != nil {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "ackwise_outcome" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out, body
}

// AwaitOutcomes waits until the scrape at url has outcome counts that ok
// accepts, and returns them and the scrape.
func AwaitOutcomes(t *testing.T, url string, ok func(map[string]float64) bool) (map[string]float64, string) {
	t.Helper()
	deadline := time.Now().Add(Wait)
	for {
		out, body := Outcomes(t, url)
		if ok(out) {
			return out, body
		}
		if time.Now().After(deadline) {
			t.Fatalf("outcomes at %s: %v, not what the test waits for", url, out)
		}
		time.Sleep(20 * time.Millisecond) // a scrape interval, shortened
	}
}

// Buffer is an io.Writer safe for concurrent use, for a worker's logs and
// traces.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// Writer returns b as an io.Writer, or io.Discard when b is nil.
func (b *Buffer) Writer() io.Writer {
	if b == nil {
		return io.Discard
	}
	return b
}

// JSONLines decodes every line written as a JSON object, failing the test
// on a line that is not one.
func (b *Buffer) JSONLines(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b.b.Bytes()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not a JSON line: %v: %s", err, sc.Text())
		}
		out = append(out, m)
	}
	return out
}

// DemoSummary is the summary of a demo run of n orders (orders.Demo) whose
// IDs start with prefix: all but the last (poison) acked and shipped once,
// the last dead-lettered, two retries for every fourth order but the last.
func DemoSummary(n int, prefix string) orders.Summary {
	flaky := (n - 1) / 4 // indexes 3, 7, … up to n-2
	return orders.Summary{Orders: n, Acked: n - 1, DeadLettered: 1, Retried: 2 * flaky, Shipped: n - 1, Shipments: n - 1, IDPrefix: prefix}
}

// AwaitDemoSettled waits until the scrape at base+"/metrics" counts the n
// demo orders settled (n-1 acked, 1 dead-lettered), checks the retries it
// counts and that it serves ackwise's instruments beside the Go runtime's,
// and returns the scrape.
func AwaitDemoSettled(t *testing.T, base string, n int) string {
	t.Helper()
	out, scrape := AwaitOutcomes(t, base+"/metrics", func(out map[string]float64) bool {
		return out["acked"] == float64(n-1) && out["dead-lettered"] == 1
	})
	if want := DemoSummary(n, "").Retried; out["retried"] != float64(want) {
		t.Errorf("retried = %v, want %d", out["retried"], want)
	}
	for _, want := range []string{"ackwise_consumer_handler_duration_seconds_bucket", "ackwise_consumer_redeliveries_total", "go_goroutines", `ackwise_consumer_name="orders-worker"`} {
		if !strings.Contains(scrape, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	return scrape
}

// CheckLogs checks that every log line is a JSON object and that one
// records the dead letter of eventID with reason permanent.
func CheckLogs(t *testing.T, logs *Buffer, eventID string) {
	t.Helper()
	for _, l := range logs.JSONLines(t) {
		if l["msg"] == "dead-lettered" && l[ackwise.LogKeyEventID] == eventID && l[ackwise.LogKeyReason] == "permanent" {
			return
		}
	}
	t.Errorf("no JSON log record of the dead letter of %s", eventID)
}

// CheckTraces checks the spans written (stdouttrace, a JSON object per
// line): runs spans named process (the handler runs) are children of the
// span "publish demo orders", in its trace.
func CheckTraces(t *testing.T, traces *Buffer, process string, runs int) {
	t.Helper()
	type span struct {
		Name        string
		SpanContext struct{ TraceID string }
		Parent      struct{ TraceID string }
	}
	var spans []span
	for _, l := range traces.JSONLines(t) {
		raw, _ := json.Marshal(l)
		var s span
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
		spans = append(spans, s)
	}
	var producer string
	for _, s := range spans {
		if s.Name == "publish demo orders" {
			producer = s.SpanContext.TraceID
		}
	}
	n := 0
	for _, s := range spans {
		if s.Name == process && producer != "" && s.Parent.TraceID == producer {
			n++
		}
	}
	if n != runs {
		t.Errorf("%d spans; %d named %q in the producer's trace %q, want %d", len(spans), n, process, producer, runs)
	}
}

// CheckDrainAndRestart is the drain test of both examples. start starts
// a worker with the options of the test but these: demo orders to publish
// first, how long each handler call takes, and handlers at once. It
// starts a worker with 30 demo orders, 2 handlers at once taking 100ms
// each, and sends SIGTERM to the process once one order is acked: the
// worker must drain and return nil, with each order it acked shipped once
// and some orders left. A second worker (no demo) must then finish the
// rest: 29 orders shipped exactly once in the PostgreSQL schema, all
// acked, the poison one dead-lettered, and its /metrics serves the
// consumer's gauges.
//
// Not for a parallel test: the signal goes to the whole test process.
func CheckDrainAndRestart(t *testing.T, schema string, start func(demo int, work time.Duration, concurrency int) *Worker) {
	t.Helper()
	const n = 30
	w := start(n, 100*time.Millisecond, 2) // at least 1.5s of work
	AwaitStatus(t, w.Base+"/readyz", http.StatusOK)
	AwaitOutcomes(t, w.Base+"/metrics", func(out map[string]float64) bool { return out["acked"] > 0 })
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r := w.Wait(t)
	if r.Err != nil {
		t.Fatalf("run after SIGTERM = %v, want nil (drained)", r.Err)
	}
	first := r.Summary
	t.Log("first worker:", first)
	// A first worker that handled everything before SIGTERM took effect
	// would leave nothing to drain: at 2 orders per 100ms, it cannot.
	if first.Acked+first.DeadLettered >= n || first.Shipments != first.Shipped || first.Shipped != first.Acked {
		t.Fatalf("first worker: %v; want some orders left, each acked order shipped once", first)
	}

	// A second worker, as after a restart, finishes the rest.
	w = start(0, 0, 4)
	_, scrape := AwaitOutcomes(t, w.Base+"/metrics", func(out map[string]float64) bool {
		return first.Acked+int(out["acked"]) >= n-1 && first.DeadLettered+int(out["dead-lettered"]) >= 1
	})
	// Without a demo the metrics Observer is the consumer's own, so its
	// gauges are served too.
	for _, want := range []string{"ackwise_consumer_in_flight", "ackwise_consumer_lag_age_seconds"} {
		if !strings.Contains(scrape, want) {
			t.Errorf("/metrics of a worker without -demo lacks the consumer's gauge %s", want)
		}
	}
	w.Cancel()
	if r := w.Wait(t); r.Err != nil {
		t.Fatal(r.Err)
	}
	store, err := orders.OpenPostgres(t.Context(), PostgresURL(), schema, "orders-worker", 2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	shipped, rows, err := store.Shipped(t.Context(), first.IDPrefix)
	if err != nil || shipped != n-1 || rows != n-1 {
		t.Fatalf("shipped %d orders in %d rows (%v); want %d in %d", shipped, rows, err, n-1, n-1)
	}
}

// CheckExitsWhenDone runs a worker with n demo orders and -exit-when-done
// (run does the rest of the options) and checks that it returns by itself,
// before the test's deadline, with the demo's summary.
func CheckExitsWhenDone(t *testing.T, n int, run func(ctx context.Context) (orders.Summary, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), Wait)
	defer cancel()
	sum, err := run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("run returned only when the test's deadline passed")
	}
	if want := DemoSummary(n, sum.IDPrefix); sum != want {
		t.Fatalf("summary %v, want %v", sum, want)
	}
}

// RunDemo runs the worker w, started with n demo orders: /readyz is 200
// while it runs, its scrape counts the orders settled (AwaitDemoSettled);
// then it is stopped (a drain) and must return nil with the demo's
// summary. It returns the summary and the scrape.
func RunDemo(t *testing.T, w *Worker, n int) (orders.Summary, string) {
	t.Helper()
	AwaitStatus(t, w.Base+"/readyz", http.StatusOK)
	scrape := AwaitDemoSettled(t, w.Base, n)
	if code, body := Get(t, w.Base+"/healthz"); code != http.StatusOK || !strings.HasPrefix(body, "running\n") {
		t.Errorf("/healthz = %d %q", code, body)
	}
	w.Cancel()
	r := w.Wait(t)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	t.Log(r.Summary)
	if want := DemoSummary(n, r.Summary.IDPrefix); r.Summary != want {
		t.Fatalf("summary %v, want %v", r.Summary, want)
	}
	return r.Summary, scrape
}
