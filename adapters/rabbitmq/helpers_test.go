package rabbitmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// testURL is the broker the tests talk to: ACKWISE_RABBITMQ_URL, else the
// local server every machine of this project runs.
func testURL() string {
	if u := os.Getenv("ACKWISE_RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// needBroker skips under -short and fails when the broker cannot be
// reached: a test that needs RabbitMQ never passes without it.
func needBroker(t testing.TB) *amqp.Connection {
	t.Helper()
	if testing.Short() {
		t.Skip("needs RabbitMQ; -short runs offline tests only")
	}
	c, err := amqp.Dial(testURL())
	if err != nil {
		t.Fatalf("RabbitMQ unreachable at %s (start it with rabbitmq-server -detached): %v", redactedTestURL(), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func redactedTestURL() string {
	c, err := newConn(testURL(), nil, 0, "", 0, 0, nil)
	if err != nil {
		return "(bad ACKWISE_RABBITMQ_URL)"
	}
	return c.redacted
}

func randSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// testConfig returns a Config on a fresh, uniquely named queue whose
// topology is deleted when the test ends.
func testConfig(t testing.TB, qt QueueType, tiers ...time.Duration) Config {
	t.Helper()
	cfg := Config{
		URL:                      testURL(),
		Queue:                    "ackwise-test-" + randSuffix(),
		QueueType:                qt,
		DelayTiers:               tiers,
		ConnectionName:           "ackwise-test-" + randSuffix(),
		ReconnectInitialInterval: 50 * time.Millisecond,
		ReconnectMaxInterval:     time.Second,
	}
	t.Cleanup(func() { deleteTopology(t, cfg) })
	return cfg
}

// deleteTopology deletes every queue of cfg's topology.
func deleteTopology(t testing.TB, cfg Config) {
	t.Helper()
	v, err := cfg.validate()
	if err != nil {
		t.Errorf("delete topology: %v", err)
		return
	}
	c, err := amqp.Dial(testURL())
	if err != nil {
		t.Errorf("delete topology: %v", err)
		return
	}
	defer c.Close()
	for _, q := range v.topology() {
		_ = withChannel(c, func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(q.name, false, false, false)
			return err
		})
	}
}

// declare declares cfg's topology.
func declare(t testing.TB, cfg Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := Declare(ctx, cfg); err != nil {
		t.Fatalf("declare: %v", err)
	}
}

// closeConnections closes, from the server side, every connection whose
// connection_name starts with prefix, with rabbitmqctl (the broker's own
// tool), and returns how many it closed.
func closeConnections(t testing.TB, prefix string) int {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections", "--no-table-headers", "pid", "client_properties").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl list_connections: %v: %s", err, out)
	}
	var pids []string
	for _, line := range strings.Split(string(out), "\n") {
		pid, props, ok := strings.Cut(strings.TrimSpace(line), "\t")
		if ok && strings.Contains(props, `{"connection_name","`+prefix) {
			pids = append(pids, pid)
		}
	}
	var wg sync.WaitGroup
	for _, pid := range pids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := exec.Command("rabbitmqctl", "-q", "close_connection", pid, "test").CombinedOutput(); err != nil {
				t.Errorf("rabbitmqctl close_connection %s: %v: %s", pid, err, out)
			}
		}()
	}
	wg.Wait()
	return len(pids)
}

// getAll takes every message now in queue (basic.get, acked).
func getAll(t testing.TB, c *amqp.Connection, queue string) []amqp.Delivery {
	t.Helper()
	ch, err := c.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	defer ch.Close()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatalf("basic.get %s: %v", queue, err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}
