package rabbitmq

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/internal/urlparam"
	"github.com/ackwise/ackwise/retry"
)

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	ok := Config{URL: "amqp://guest:s3cret@localhost:5672/", Queue: "orders"}
	cases := []struct {
		name string
		mod  func(*Config)
		want string // substring of the error; "" means valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"no URL", func(c *Config) { c.URL = "" }, "URL is empty"},
		{"bad scheme", func(c *Config) { c.URL = "http://guest:s3cret@localhost/" }, "URL"},
		{"no queue", func(c *Config) { c.Queue = "" }, "Queue is empty"},
		{"reserved queue", func(c *Config) { c.Queue = "amq.foo" }, `Queue = "amq.foo"`},
		{"queue type", func(c *Config) { c.QueueType = "stream" }, `QueueType = "stream"`},
		{"prefetch", func(c *Config) { c.Prefetch = -3 }, "Prefetch = -3"},
		{"prefetch too big", func(c *Config) { c.Prefetch = 70000 }, "Prefetch = 70000"},
		{"tier below ms", func(c *Config) { c.DelayTiers = []time.Duration{time.Second, 10 * time.Microsecond} }, "DelayTiers[1] = 10µs"},
		{"tier fraction of ms", func(c *Config) { c.DelayTiers = []time.Duration{1500 * time.Microsecond} }, "DelayTiers[0] = 1.5ms"},
		{"dlq is queue", func(c *Config) { c.DeadLetterQueue = "orders" }, `DeadLetterQueue = "orders"`},
		// Dead letters would expire back into the work queue.
		{"dlq is a wait queue", func(c *Config) { c.DelayTiers = []time.Duration{time.Second}; c.DeadLetterQueue = "orders.wait.1s" }, `DeadLetterQueue = "orders.wait.1s"`},
		{"consumer timeout", func(c *Config) { c.ConsumerTimeout = -5 }, "ConsumerTimeout = -5ns"},
		{"warn above timeout", func(c *Config) { c.ConsumerTimeout = time.Minute; c.ConsumerTimeoutWarn = 2 * time.Minute }, "ConsumerTimeoutWarn = 2m0s"},
		{"heartbeat", func(c *Config) { c.Heartbeat = -time.Second }, "Heartbeat = -1s"},
		{"heartbeat below 1s", func(c *Config) { c.Heartbeat = 500 * time.Millisecond }, "Heartbeat = 500ms"},
		{"heartbeat beyond uint16 seconds", func(c *Config) { c.Heartbeat = 20 * time.Hour }, "Heartbeat = 20h0m0s"},
		{"reconnect", func(c *Config) { c.ReconnectInitialInterval = time.Minute; c.ReconnectMaxInterval = time.Second }, "ReconnectMaxInterval = 1s"},
		{"no warning", func(c *Config) { c.ConsumerTimeout = -1 }, ""},
		{"plain", func(c *Config) { c.Plain = true }, ""},
		{"plain and declare", func(c *Config) { c.Plain = true; c.DeclareTopology = true }, "Plain = true with DeclareTopology = true"},
		// Contradictions that were accepted with one side silently dropped.
		{"plain and tiers", func(c *Config) { c.Plain = true; c.DelayTiers = []time.Duration{time.Second} }, "Plain = true with DelayTiers = [1s]"},
		{"plain and dlq", func(c *Config) { c.Plain = true; c.DeadLetterQueue = "dead" }, `Plain = true with DeadLetterQueue = "dead"`},
		{"warn without timeout", func(c *Config) { c.ConsumerTimeout = -1; c.ConsumerTimeoutWarn = time.Minute }, "ConsumerTimeoutWarn = 1m0s with ConsumerTimeout = -1"},
		// A plain source has no wait or dead-letter queue: the names it
		// would give them are not its concern. A dead-letter queue of a
		// long-named queue was refused here (its wait queue name,
		// <250 bytes>.wait.1s, is too long).
		{"plain with a long name", func(c *Config) { c.Plain = true; c.Queue = strings.Repeat("q", 250) }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.mod(&cfg)
			_, err := cfg.validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("no error, want one containing %q", tc.want)
			case err != nil && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q does not contain %q", err, tc.want)
			case err != nil && strings.Contains(err.Error(), "s3cret"):
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	v, err := Config{URL: "amqp://localhost/", Queue: "orders"}.validate()
	if err != nil {
		t.Fatal(err)
	}
	if v.QueueType != Classic || v.Prefetch != DefaultPrefetch || v.DeadLetterQueue != "orders.dlq" ||
		v.ConsumerTimeout != DefaultConsumerTimeout || v.ConsumerTimeoutWarn != 24*time.Minute {
		t.Fatalf("defaults: %+v", v.Config)
	}
	// No tiers named, no wait queues: retries wait in place.
	if len(v.DelayTiers) != 0 || len(v.waitQueues) != 0 {
		t.Fatalf("without DelayTiers: tiers %v, wait queues %v, want none", v.DelayTiers, v.waitQueues)
	}
	v, err = Config{URL: "amqp://localhost/", Queue: "orders", DelayTiers: TiersFor(retry.Policy{})}.validate()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"orders.wait.1s", "orders.wait.2s", "orders.wait.4s", "orders.wait.8s"}; !slices.Equal(v.waitQueues, want) {
		t.Fatalf("wait queues %v, want %v", v.waitQueues, want)
	}
}

func TestTiersFor(t *testing.T) {
	t.Parallel()
	cases := []struct {
		p    retry.Policy
		want []time.Duration
	}{
		{retry.Policy{}, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}},
		{retry.Policy{Tiers: []time.Duration{time.Minute, time.Second, time.Minute}}, []time.Duration{time.Second, time.Minute}},
		{retry.Policy{MaxAttempts: 1}, []time.Duration{time.Second}},
		{retry.Policy{MaxAttempts: retry.Unlimited, InitialInterval: time.Minute, MaxInterval: 5 * time.Minute}, []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute}},
	}
	for _, tc := range cases {
		if got := TiersFor(tc.p); !slices.Equal(got, tc.want) {
			t.Errorf("TiersFor(%+v) = %v, want %v", tc.p, got, tc.want)
		}
	}
}

func TestWaitQueueName(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		30 * time.Second:        "q.wait.30s",
		5 * time.Minute:         "q.wait.5m",
		2 * time.Hour:           "q.wait.2h",
		90 * time.Second:        "q.wait.90s",
		1500 * time.Millisecond: "q.wait.1500ms",
	} {
		if got := WaitQueueName("q", d); got != want {
			t.Errorf("WaitQueueName(q, %v) = %q, want %q", d, got, want)
		}
	}
}

func TestTierFor(t *testing.T) {
	t.Parallel()
	s := &Source{v: validated{Config: Config{DelayTiers: []time.Duration{time.Second, 10 * time.Second, time.Minute}}}}
	for d, want := range map[time.Duration]int{0: 0, time.Second: 0, 1001 * time.Millisecond: 1, 10 * time.Second: 1, 30 * time.Second: 2, time.Hour: 2} {
		if got := s.tierFor(d); got != want {
			t.Errorf("tierFor(%v) = %d, want %d", d, got, want)
		}
	}
}

func TestConfigFromURL(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("rabbit://user:pa55@broker:5673/orders?vhost=prod&queue_type=quorum&prefetch=64&tiers=1s,10s,1m&declare=true&dlq=orders.dead&consumer_timeout=1h&heartbeat=5s&connection_name=billing")
	cfg, err := ConfigFromURL(u)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		URL: "amqp://user:pa55@broker:5673/prod", Queue: "orders", QueueType: Quorum, Prefetch: 64,
		DelayTiers: []time.Duration{time.Second, 10 * time.Second, time.Minute}, DeclareTopology: true,
		DeadLetterQueue: "orders.dead", ConsumerTimeout: time.Hour, Heartbeat: 5 * time.Second, ConnectionName: "billing",
	}
	if cfg.URL != want.URL || cfg.Queue != want.Queue || cfg.QueueType != want.QueueType || cfg.Prefetch != want.Prefetch ||
		!slices.Equal(cfg.DelayTiers, want.DelayTiers) || !cfg.DeclareTopology || cfg.DeadLetterQueue != want.DeadLetterQueue ||
		cfg.ConsumerTimeout != want.ConsumerTimeout || cfg.Heartbeat != want.Heartbeat || cfg.ConnectionName != want.ConnectionName || cfg.TLS != nil {
		t.Fatalf("got %+v\nwant %+v", cfg, want)
	}

	u, _ = url.Parse("amqps://user:pa55@broker/orders?tls_server_name=rabbit.internal&tls_insecure_skip_verify=true")
	cfg, err = ConfigFromURL(u)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cfg.URL, "amqps://") || cfg.TLS == nil || cfg.TLS.ServerName != "rabbit.internal" || !cfg.TLS.InsecureSkipVerify {
		t.Fatalf("TLS not configured: %+v", cfg)
	}
	u, _ = url.Parse("rabbit://broker/orders?tls=true&vhost=%2F")
	if cfg, err = ConfigFromURL(u); err != nil || !strings.HasPrefix(cfg.URL, "amqps://") || cfg.URL != "amqps://broker/" {
		t.Fatalf("rabbit tls=true: %v %+v", err, cfg)
	}

	bad := map[string]string{
		"amqp://user:pa55@broker/orders?prefetch=x":                                   `URL parameter "prefetch" = "x": want an integer in [0, 65535]`,
		"amqp://user:pa55@broker/orders?prefetch=65536":                               `URL parameter "prefetch" = "65536": want an integer in [0, 65535]`,
		"amqp://user:pa55@broker/orders?bogus=1":                                      `URL parameter "bogus" is unknown (known: vhost, queue_type,`,
		"amqp://user:pa55@broker/orders?prefetch=1&prefetch=2":                        `URL parameter "prefetch" is given more than once`,
		"amqp://user:pa55@broker/":                                                    "names no queue",
		"amqp://user:pa55@broker/orders?tls_ca=/x":                                    `URL parameter "tls_ca" needs TLS: use amqps://`,
		"amqp://user:pa55@broker/orders?tiers=1s,abc":                                 `URL parameter "tiers" = "1s,abc": "abc" is not a Go duration of at least 1ms`,
		"amqp://user:pa55@broker/orders?tiers=1500us":                                 `URL parameter "tiers" = "1500us": 1.5ms is not a whole number of milliseconds`,
		"amqps://user:pa55@broker/o?tls_ca=/nonexist":                                 `URL parameter "tls_ca" = "/nonexist": cannot read it`,
		"amqp://user:pa55@broker/orders?tls=true":                                     `URL parameter "tls" is for rabbit:// URLs`,
		"amqp://user:pa55@broker/orders?queue_type=lazy":                              `URL parameter "queue_type" = "lazy": want one of classic, quorum`,
		"amqp://user:pa55@broker/orders?heartbeat=500ms":                              `URL parameter "heartbeat" = "500ms": want at least 1s`,
		"amqp://user:pa55@broker/orders?heartbeat=-1":                                 `URL parameter "heartbeat" = "-1": want a Go duration in [0s, 18h12m15s]`,
		"amqp://user:pa55@broker/orders?consumer_timeout=-2s":                         `URL parameter "consumer_timeout" = "-2s": want a Go duration of at least -1ns, or -1`,
		"amqp://user:pa55@broker/orders?consumer_timeout=-1&consumer_timeout_warn=1m": `URL parameter "consumer_timeout_warn" = "1m": cannot go with consumer_timeout=-1`,
		"amqp://user:pa55@broker/orders?consumer_timeout=1m&consumer_timeout_warn=2m": `URL parameter "consumer_timeout_warn" = "2m": is longer than consumer_timeout = 1m0s`,
		"amqp://user:pa55@broker/orders?consumer_timeout_warn=31m":                    `URL parameter "consumer_timeout_warn" = "31m": is longer than the default consumer_timeout, 30m0s`,
		"amqp://user:pa55@broker/orders.dlq?plain=true&declare=true":                  `URL parameter "declare" = "true": cannot go with plain=true`,
		"amqp://user:pa55@broker/orders.dlq?plain=true&declare=false&tiers=1s":        `URL parameter "tiers" = "1s": cannot go with plain=true`,
		"amqp://user:pa55@broker/orders.dlq?plain=true&dlq=x":                         `URL parameter "dlq" = "x": cannot go with plain=true`,
		"amqp://user:pa55@broker/orders?dlq=orders":                                   `URL parameter "dlq" = "orders": is the queue itself`,
		"amqp://user:pa55@broker/orders?dlq=amq.x":                                    `URL parameter "dlq" = "amq.x": the amq. prefix is reserved by the broker`,
		"amqp://user:pa55@broker/orders?tiers=1s&dlq=orders.wait.1s":                  `URL parameter "dlq" = "orders.wait.1s": is the wait queue of the delay tier 1s`,
		"amqp://user:pa55@broker/" + strings.Repeat("q", 250) + "?dlq=d&tiers=1s":     `URL parameter "tiers" = "1s": the wait queue of 1s, "` + strings.Repeat("q", 250) + `.wait.1s", would be longer than 255 bytes`,
		"amqp://user:pa55@broker/" + strings.Repeat("q", 253):                         `whose dead-letter queue "` + strings.Repeat("q", 253) + `.dlq" would be longer than 255 bytes: name another with dlq=`,
		"amqp://user:pa55@broker/amq.orders":                                          `rabbitmq: URL path names queue "amq.orders": the amq. prefix is reserved by the broker`,
		"http://user:pa55@broker/orders":                                              `rabbitmq: URL "http://user:xxxxx@broker/orders" has scheme "http"; want amqp, amqps, rabbit`,
		"amqp://user:pa55@/orders":                                                    `rabbitmq: URL "amqp://user:xxxxx@/orders" has no host`,
	}
	for raw, want := range bad {
		u, _ := url.Parse(raw)
		_, err := ConfigFromURL(u)
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, urlparam.ErrParam) {
			t.Errorf("%s: error %v, want one containing %q (and matching urlparam.ErrParam)", raw, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "pa55") {
			t.Errorf("%s: error leaks the password: %v", raw, err)
		}
	}
}

func TestSinkConfigFromURL(t *testing.T) {
	t.Parallel()
	u, _ := url.Parse("amqp://broker/orders?declare=true")
	sc, decl, err := SinkConfigFromURL(u)
	if err != nil || sc.Exchange != "" || sc.RoutingKey != "orders" || decl == nil || decl.Queue != "orders" {
		t.Fatalf("got %+v %+v %v", sc, decl, err)
	}
	// A sink that declares nothing publishes by the queue's name, whatever
	// its wait queues' names would be.
	long := strings.Repeat("q", 250)
	u, _ = url.Parse("amqp://broker/" + long)
	if sc, _, err := SinkConfigFromURL(u); err != nil || sc.RoutingKey != long {
		t.Fatalf("sink on a long queue name: %+v %v", sc, err)
	}
	u, _ = url.Parse("amqp://broker/" + long + "?declare=true&tiers=1s&dlq=d")
	if _, _, err := SinkConfigFromURL(u); err == nil || !strings.Contains(err.Error(), "longer than 255 bytes") {
		t.Fatalf("sink declaring a long queue's topology: %v", err)
	}
	u, _ = url.Parse("amqp://broker/?exchange=events&routing_key=orders.created")
	sc, decl, err = SinkConfigFromURL(u)
	if err != nil || sc.Exchange != "events" || sc.RoutingKey != "orders.created" || decl != nil {
		t.Fatalf("got %+v %+v %v", sc, decl, err)
	}
	// A queue in the path and an exchange or routing key: one of them was
	// silently dropped.
	for _, raw := range []string{"amqp://broker/orders?exchange=events&routing_key=x", "amqp://broker/orders?routing_key=other"} {
		u, _ = url.Parse(raw)
		if _, _, err := SinkConfigFromURL(u); err == nil || !strings.Contains(err.Error(), "a sink publishes to one") {
			t.Errorf("%s: %v, want an error naming both destinations", raw, err)
		}
	}
	if _, err := (SinkConfig{URL: "amqp://broker/"}).validate(); err == nil || !strings.Contains(err.Error(), "RoutingKey") {
		t.Fatalf("default exchange without routing key: %v", err)
	}
}

func TestSchemesRegistered(t *testing.T) {
	t.Parallel()
	got := adapters.Schemes()
	for _, s := range []string{"amqp", "amqps", "rabbit"} {
		if !slices.Contains(got, s) {
			t.Errorf("scheme %q not registered: %v", s, got)
		}
	}
}

func TestUnreachableBrokerFailsWithoutPassword(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Port 1 on loopback refuses at once.
	_, err := adapters.OpenSource(ctx, "amqp://guest:t0psecret@127.0.0.1:1/orders")
	if err == nil {
		t.Fatal("no error from an unreachable broker")
	}
	if strings.Contains(err.Error(), "t0psecret") {
		t.Fatalf("error leaks the password: %v", err)
	}
	_, err = adapters.OpenSink(ctx, "amqp://guest:t0psecret@127.0.0.1:1/orders")
	if err == nil || strings.Contains(err.Error(), "t0psecret") {
		t.Fatalf("sink error %v", err)
	}
}
