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
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ackwise/ackwise/examples/internal/orders"
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
