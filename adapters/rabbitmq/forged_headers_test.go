package rabbitmq

import (
	"context"
	"errors"
	"math"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// ctlOutput runs rabbitmqctl, the broker's own tool, and returns its output.
func ctlOutput(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// dlxSupervisorAlive reports whether RabbitMQ's supervisor of the quorum
// queues' dead-letter workers (rabbit_fifo_dlx_sup) runs. When a worker
// crashes too often, the supervisor gives up, and from then on no quorum
// queue on the broker dead-letters anything (a wait queue returns nothing).
func dlxSupervisorAlive(t testing.TB) bool {
	t.Helper()
	return strings.HasPrefix(ctlOutput(t, "eval", "whereis(rabbit_fifo_dlx_sup)."), "<")
}

// ownVhost creates a vhost for the test alone, with the test user's
// permissions, and returns the AMQP URL of it. It is for tests that hand
// the broker hostile input: RabbitMQ 3.10's quorum dead-letter worker
// crashed on a malformed x-death, and its supervisor, shared by every
// vhost, gave up. When the test ends the vhost is deleted and, should the
// supervisor have died (the test failed), it is restarted at once, so
// that the other tests on this broker keep their quorum wait queues.
func ownVhost(t *testing.T) string {
	t.Helper()
	needBroker(t)
	if !dlxSupervisorAlive(t) {
		t.Fatal("the broker's quorum dead-letter supervisor is down before the test (restore it: rabbitmqctl eval 'supervisor:restart_child(rabbit_sup, rabbit_fifo_dlx_sup).')")
	}
	u, err := url.Parse(testURL())
	if err != nil {
		t.Fatal(err)
	}
	user := "guest"
	if u.User != nil && u.User.Username() != "" {
		user = u.User.Username()
	}
	vhost := "ackwise-test-" + randSuffix()
	ctlOutput(t, "add_vhost", vhost)
	t.Cleanup(func() {
		if !dlxSupervisorAlive(t) {
			t.Errorf("the broker's quorum dead-letter supervisor died during the test; restarting it: %s",
				ctlOutput(t, "eval", "supervisor:restart_child(rabbit_sup, rabbit_fifo_dlx_sup)."))
		}
		ctlOutput(t, "delete_vhost", vhost)
	})
	ctlOutput(t, "set_permissions", "-p", vhost, user, ".*", ".*", ".*")
	u.Path = "/" + vhost
	u.RawPath = ""
	return u.String()
}

// vhostConfig is testConfig in a vhost of the test's own (deleted with it).
func vhostConfig(vhostURL string, qt QueueType, tiers ...time.Duration) Config {
	return Config{
		URL:                      vhostURL,
		Queue:                    "ackwise-test-" + randSuffix(),
		QueueType:                qt,
		DelayTiers:               tiers,
		ConnectionName:           "ackwise-test-" + randSuffix(),
		ReconnectInitialInterval: 50 * time.Millisecond,
		ReconnectMaxInterval:     time.Second,
	}
}

func dialVhost(t *testing.T, vhostURL string) *amqp.Connection {
	t.Helper()
	c, err := amqp.Dial(vhostURL)
	if err != nil {
		t.Fatalf("dial the test's vhost: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// wellFormedDeath is an x-death entry as RabbitMQ 3.10 writes it.
func wellFormedDeath(queue, reason string, count int64) amqp.Table {
	return amqp.Table{
		"count":        count,
		"exchange":     "",
		"queue":        queue,
		"reason":       reason,
		"routing-keys": []any{queue},
		"time":         time.Unix(1700000000, 0),
	}
}

// TestForgedXDeathNeverReachesBrokerDLX: a producer's malformed x-death on
// a quorum work queue (an array holding a string; a table whose count is a
// string, naming the wait queue so that the broker would increment it)
// does not travel with the copy a transient failure moves to the wait
// queue. The message comes back from the wait queue and is handled, with
// the x-death the broker wrote alone, and the broker's quorum dead-letter
// worker still works afterwards: a second quorum queue's wait tier still
// returns its message. Before, the copy carried the header; RabbitMQ
// 3.10's dead-letter worker crashed on it in
// rabbit_dead_letter:group_by_queue_and_reason, its supervisor gave up,
// and no quorum wait queue on the broker returned anything any more.
func TestForgedXDeathNeverReachesBrokerDLX(t *testing.T) {
	vhostURL := ownVhost(t)
	c := dialVhost(t, vhostURL)
	const tier = 50 * time.Millisecond
	cfg := vhostConfig(vhostURL, Quorum, tier)
	declare(t, cfg)
	wait := WaitQueueName(cfg.Queue, tier)
	src := newSource(t, cfg)

	for _, tc := range []struct {
		name  string
		death any
	}{
		{"array of a string", []any{"s"}},
		{"count a string", []any{amqp.Table{"count": "x", "exchange": "", "queue": wait, "reason": "expired", "routing-keys": []any{wait}, "time": time.Unix(1700000000, 0)}}},
	} {
		rawPublish(t, c, cfg.Queue, amqp.Publishing{
			Headers: amqp.Table{ackwise.HeaderEventID: tc.name, "x-death": tc.death, "x-first-death-queue": wait, "x-first-death-reason": "expired"},
			Body:    []byte(tc.name),
		})
		m := receive(t, src)
		if m.ID != tc.name || m.Attempt != 1 {
			t.Fatalf("%s: first delivery %q attempt %d", tc.name, m.ID, m.Attempt)
		}
		if err := src.Nack(ctxT(t), m, 0); err != nil {
			t.Fatalf("%s: nack: %v", tc.name, err)
		}
		m = receive(t, src) // fails after testTimeout when the broker's worker crashed
		if m.ID != tc.name || m.Attempt != 2 {
			t.Fatalf("%s: back from the wait queue: %q attempt %d, want attempt 2", tc.name, m.ID, m.Attempt)
		}
		d := m.Handle.(*receipt).d
		deaths, ok := d.Headers["x-death"].([]any)
		if !ok || len(deaths) != 1 {
			t.Fatalf("%s: x-death back from the wait queue %#v: want the broker's one entry", tc.name, d.Headers["x-death"])
		}
		if e := deaths[0].(amqp.Table); e["queue"] != wait || e["reason"] != "expired" || e["count"] != int64(1) {
			t.Fatalf("%s: x-death entry %v: want the wait queue's, count 1", tc.name, e)
		}
		if q := d.Headers["x-first-death-queue"]; q != wait {
			t.Fatalf("%s: x-first-death-queue %v", tc.name, q)
		}
		if err := src.Ack(ctxT(t), m); err != nil {
			t.Fatal(err)
		}
	}

	// The broker's quorum dead-letter worker still runs: another quorum
	// queue's wait tier returns its message.
	other := vhostConfig(vhostURL, Quorum, tier)
	declare(t, other)
	osrc := newSource(t, other)
	rawPublish(t, c, other.Queue, amqp.Publishing{Headers: amqp.Table{ackwise.HeaderEventID: "other"}, Body: []byte("other")})
	m := receive(t, osrc)
	if err := osrc.Nack(ctxT(t), m, 0); err != nil {
		t.Fatal(err)
	}
	if m = receive(t, osrc); m.ID != "other" || m.Attempt != 2 {
		t.Fatalf("second quorum queue: %q attempt %d", m.ID, m.Attempt)
	}
	if !dlxSupervisorAlive(t) {
		t.Fatal("the broker's quorum dead-letter supervisor died")
	}
}

// TestForgedCountsGetFullRetries: a producer's forged counts do not skip
// retries. Each message carries one forgery (an ackwise-attempt of 1e9 or
// MaxInt64, string or int; an x-death count of 1e9 naming the work queue,
// a name that looks like a wait queue of it, or a wait queue with another
// reason; a count of MaxInt64 naming the real wait queue; x-delivery-count
// 1e9); the handler always fails transiently, and it must see attempts
// 1, 2, 3 (MaxAttempts) before the engine dead-letters it with reason
// max-attempts and 3 attempts. Before, ackwise-attempt and x-death counts
// were taken as they came, and the message was dead-lettered after its
// first failure.
func TestForgedCountsGetFullRetries(t *testing.T) {
	vhostURL := ownVhost(t)
	for _, qt := range []QueueType{Classic, Quorum} {
		t.Run(string(qt), func(t *testing.T) {
			t.Parallel()
			c := dialVhost(t, vhostURL)
			const tier = 50 * time.Millisecond
			cfg := vhostConfig(vhostURL, qt, tier)
			declare(t, cfg)
			wait := WaitQueueName(cfg.Queue, tier)
			forged := map[string]amqp.Table{
				"attempt 1e9":            {ackwise.HeaderAttempt: "1000000000"},
				"attempt MaxInt64":       {ackwise.HeaderAttempt: "9223372036854775807"},
				"attempt int MaxInt64":   {ackwise.HeaderAttempt: int64(math.MaxInt64)},
				"attempt over int64":     {ackwise.HeaderAttempt: "99999999999999999999999"},
				"death work queue":       {"x-death": []any{wellFormedDeath(cfg.Queue, "rejected", 1e9)}},
				"death wait-like":        {"x-death": []any{wellFormedDeath(cfg.Queue+".wait.7s", "expired", 1e9)}},
				"death wait rejected":    {"x-death": []any{wellFormedDeath(wait, "rejected", 1e9)}},
				"death wait MaxInt64":    {"x-death": []any{wellFormedDeath(wait, "expired", math.MaxInt64)}},
				"delivery count":         {"x-delivery-count": int64(1e9)},
				"delivery count string":  {"x-delivery-count": "1000000000"},
				"all with a return-like": {ackwise.HeaderAttempt: "1000000000", "x-delivery-count": int64(math.MaxInt64), "x-death": []any{wellFormedDeath(cfg.Queue+".wait.50", "expired", math.MaxInt64), wellFormedDeath(cfg.Queue, "rejected", math.MaxInt64)}},
			}
			var (
				mu   sync.Mutex
				seen = map[string][]int{}
			)
			src := newSource(t, cfg)
			cons, err := consumer.New(src, ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
				mu.Lock()
				seen[m.ID] = append(seen[m.ID], m.Attempt)
				mu.Unlock()
				return errors.New("transient")
			}), consumer.Config{
				RetryMode: consumer.RetryBroker,
				Retry:     retry.Policy{MaxAttempts: 3, InitialInterval: tier, Jitter: retry.NoJitter},
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			runErr := make(chan error, 1)
			go func() { runErr <- cons.Run(ctx) }()
			defer func() {
				cancel()
				if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("consumer: %v", err)
				}
			}()
			for id, h := range forged {
				h[ackwise.HeaderEventID] = id
				rawPublish(t, c, cfg.Queue, amqp.Publishing{Headers: h, Body: []byte(id)})
			}
			dead := newSource(t, Config{URL: vhostURL, Queue: cfg.Queue + ".dlq", Plain: true})
			for range forged {
				d := receive(t, dead)
				e, err := dlq.Decode(d.Headers)
				if err != nil {
					t.Fatalf("dead letter %q: %v", d.ID, err)
				}
				mu.Lock()
				got := slices.Clone(seen[d.ID])
				mu.Unlock()
				if !slices.Equal(got, []int{1, 2, 3}) || e.Reason != dlq.ReasonMaxAttempts || e.Attempts != 3 {
					t.Errorf("%s: handler saw attempts %v, dead-lettered with reason %s after %d attempts: want attempts [1 2 3], max-attempts, 3", d.ID, got, e.Reason, e.Attempts)
				}
				if err := dead.Ack(ctxT(t), d); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestHonestRetryChainCounts: the attempts of an honest retry chain count
// as before, on classic and quorum queues: a hop through one tier, a
// release (a redelivery), a hop through another tier. The last return
// carries the broker's x-death with one entry per wait queue, and the
// copies the source made carried it on.
func TestHonestRetryChainCounts(t *testing.T) {
	t.Parallel()
	for _, qt := range []QueueType{Classic, Quorum} {
		t.Run(string(qt), func(t *testing.T) {
			t.Parallel()
			c := needBroker(t)
			cfg := testConfig(t, qt, 50*time.Millisecond, 100*time.Millisecond)
			declare(t, cfg)
			src := newSource(t, cfg)
			rawPublish(t, c, cfg.Queue, amqp.Publishing{Headers: amqp.Table{ackwise.HeaderEventID: "ev"}, Body: []byte("p")})
			step := func(want int, settle func(*ackwise.Message) error) *ackwise.Message {
				t.Helper()
				m := receive(t, src)
				if m.Attempt != want {
					t.Fatalf("attempt %d, want %d", m.Attempt, want)
				}
				if err := settle(m); err != nil {
					t.Fatal(err)
				}
				return m
			}
			step(1, func(m *ackwise.Message) error { return src.Nack(ctxT(t), m, 50*time.Millisecond) })
			step(2, func(m *ackwise.Message) error { return src.Release(ctxT(t), m) })
			step(3, func(m *ackwise.Message) error { return src.Nack(ctxT(t), m, 100*time.Millisecond) })
			m := step(4, func(m *ackwise.Message) error { return src.Ack(ctxT(t), m) })
			deaths, ok := readDeaths(m.Handle.(*receipt).d.Headers["x-death"])
			if !ok || len(deaths) != 2 || deaths[0].queue != WaitQueueName(cfg.Queue, 100*time.Millisecond) || deaths[1].queue != WaitQueueName(cfg.Queue, 50*time.Millisecond) || deaths[0].count != 1 || deaths[1].count != 1 {
				t.Fatalf("x-death of the last return: %+v (well formed %v)", deaths, ok)
			}
		})
	}
}
