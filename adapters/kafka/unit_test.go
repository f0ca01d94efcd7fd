package kafka

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ackwise/ackwise/adapters"
)

func TestTrackerCommitsBelowFirstUnsettled(t *testing.T) {
	p := newPartition("t", 0, false)
	var seqs []int64
	offs := []int64{10, 11, 13, 14, 20}
	for _, off := range offs { // gaps: compaction, txn markers
		seqs = append(seqs, p.track(off, 1, true))
	}
	if p.commitOff != 10 {
		t.Fatalf("commit offset %d before any settle, want 10", p.commitOff)
	}
	// Out of order, as parallel handlers of different keys settle.
	steps := []struct {
		i    int
		want int64
	}{{2, 10}, {4, 10}, {1, 10}, {0, 14}, {3, 21}}
	for _, s := range steps {
		if !p.settle(seqs[s.i], stSettled) {
			t.Fatalf("settle %d refused", s.i)
		}
		if p.commitOff != s.want {
			t.Fatalf("after settling offset %d: commit %d, want %d", offs[s.i], p.commitOff, s.want)
		}
	}
	if p.settle(seqs[0], stSettled) {
		t.Fatal("second settle of the same record accepted")
	}
	if p.inflight != 0 {
		t.Fatalf("inflight %d", p.inflight)
	}
}

func TestTrackerReleasedHoldsCommit(t *testing.T) {
	p := newPartition("t", 0, false)
	a := p.track(0, 0, true)
	b := p.track(1, 0, true)
	p.settle(b, stSettled)
	p.settle(a, stReleased)
	if p.commitOff != 0 {
		t.Fatalf("commit %d past a released record", p.commitOff)
	}
	if got := p.settledAbove(); !slices.Equal(got, []int64{1}) {
		t.Fatalf("settled above %v, want [1]", got)
	}
}

func TestTrackerCompaction(t *testing.T) {
	p := newPartition("t", 0, false)
	var seqs []int64
	for off := int64(0); off < 1000; off++ {
		seqs = append(seqs, p.track(off, 0, true))
		if off%3 == 2 { // settle in bursts, oldest last
			for _, s := range []int64{seqs[off], seqs[off-1], seqs[off-2]} {
				if !p.settle(s, stSettled) {
					t.Fatalf("settle seq %d refused at offset %d", s, off)
				}
			}
		}
	}
	p.settle(seqs[999], stSettled)
	if p.commitOff != 1000 || len(p.ents)-p.head != 0 {
		t.Fatalf("commit %d, tracked %d", p.commitOff, len(p.ents)-p.head)
	}
	if len(p.ents) > 200 {
		t.Fatalf("tracking slice grew to %d: not compacted", len(p.ents))
	}
}

// TestBrokerID checks the broker ID's offset digits against strconv
// over runs of consecutive offsets that cross a digit count, jumps (gaps
// from compaction and transaction markers), a restart at 0 and a step back
// (a partition re-consumed after a rebalance).
func TestBrokerID(t *testing.T) {
	p := newPartition("t", 0, false)
	var offs []int64
	for _, run := range [][2]int64{{0, 1005}, {1007, 1010}, {9_990, 10_010}, {99_999, 100_001}, {5, 12}, {1 << 40, 1<<40 + 3}, {999_999_998, 1_000_000_001}} {
		for off := run[0]; off <= run[1]; off++ {
			offs = append(offs, off)
		}
	}
	for _, off := range offs {
		got := string(p.brokerID(off))
		if want := "t/0@" + strconv.FormatInt(off, 10); got != want {
			t.Fatalf("offset %d: %q, want %q", off, got, want)
		}
	}
}

func TestSettledMetadataRoundTrip(t *testing.T) {
	offs := []int64{101, 102, 150, 100000}
	meta := encodeSettled(100, offs)
	got := decodeSettled(100, meta)
	if len(got) != len(offs) {
		t.Fatalf("decoded %v from %q", got, meta)
	}
	for _, o := range offs {
		if _, ok := got[o]; !ok {
			t.Fatalf("offset %d lost in %q", o, meta)
		}
	}
	if decodeSettled(100, "something else") != nil {
		t.Fatal("foreign metadata decoded")
	}
	// The committed offset moved with the metadata copied along (kadm's
	// fetch, edit, commit): read against the new offset the deltas would
	// name other records, which the next owner would skip unsettled.
	if got := decodeSettled(99, meta); got != nil {
		t.Fatalf("metadata encoded against offset 100 decoded against 99: %v", got)
	}
	many := make([]int64, 10000)
	for i := range many {
		many[i] = int64(200 + i*1000)
	}
	if m := encodeSettled(100, many); len(m) > maxMetaBytes {
		t.Fatalf("metadata %d bytes, limit %d", len(m), maxMetaBytes)
	}
}

func TestFormatTier(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Minute: "1m", 10 * time.Minute: "10m", 90 * time.Minute: "1h30m",
		30 * time.Second: "30s", 500 * time.Millisecond: "500ms", 2 * time.Hour: "2h", 61 * time.Second: "1m1s",
	} {
		if got := FormatTier(d); got != want {
			t.Errorf("FormatTier(%v) = %q, want %q", d, got, want)
		}
	}
	if got := DefaultRetryTopic("orders", time.Minute); got != "orders.retry.1m" {
		t.Errorf("DefaultRetryTopic = %q", got)
	}
}

func TestConfigValidation(t *testing.T) {
	ok := SourceConfig{ClientConfig: ClientConfig{Brokers: []string{"127.0.0.1:9092"}}, Topic: "orders", Group: "g"}
	cases := []struct {
		name   string
		change func(*SourceConfig)
		want   string // substring of the error; empty: valid
	}{
		{"valid", func(*SourceConfig) {}, ""},
		{"no brokers", func(c *SourceConfig) { c.Brokers = nil }, "SourceConfig.Brokers"},
		{"bad broker", func(c *SourceConfig) { c.Brokers = []string{"a b"} }, `SourceConfig.Brokers[0] = "a b"`},
		{"no topic", func(c *SourceConfig) { c.Topic = "" }, "SourceConfig.Topic is empty"},
		{"bad topic", func(c *SourceConfig) { c.Topic = "or/ders" }, `SourceConfig.Topic = "or/ders"`},
		{"no group", func(c *SourceConfig) { c.Group = "" }, "SourceConfig.Group"},
		{"negative tier", func(c *SourceConfig) { c.RetryTiers = []time.Duration{-time.Second} }, "SourceConfig.RetryTiers has -1s"},
		{"duplicate tier", func(c *SourceConfig) { c.RetryTiers = []time.Duration{time.Second, time.Second} }, "1s twice"},
		{"colliding retry topic", func(c *SourceConfig) {
			c.RetryTiers = []time.Duration{time.Second}
			c.RetryTopic = func(string, time.Duration) string { return "orders.dlq" }
		}, "collides"},
		{"dlq is topic", func(c *SourceConfig) { c.DeadLetterTopic = "orders" }, `SourceConfig.DeadLetterTopic = "orders"`},
		{"bad start", func(c *SourceConfig) { c.StartOffset = "middle" }, `SourceConfig.StartOffset = "middle"`},
		{"negative commit interval", func(c *SourceConfig) { c.CommitInterval = -time.Second }, "SourceConfig.CommitInterval = -1s"},
		{"bad revoke timeout", func(c *SourceConfig) { c.RevokeTimeout = -2 }, "SourceConfig.RevokeTimeout"},
		{"negative poll batch", func(c *SourceConfig) { c.PollBatch = -1 }, "SourceConfig.PollBatch = -1"},
		{"negative fetch max bytes", func(c *SourceConfig) { c.FetchMaxBytes = -1 }, "SourceConfig.FetchMaxBytes = -1"},
		{"negative fetch max partition bytes", func(c *SourceConfig) { c.FetchMaxPartitionBytes = -2 }, "SourceConfig.FetchMaxPartitionBytes = -2"},
		{"bounded poll", func(c *SourceConfig) { c.PollBatch, c.FetchMaxBytes = 100, 1<<20 }, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			c.change(&cfg)
			err := cfg.withDefaults().validate()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

func TestParseURL(t *testing.T) {
	u, _ := url.Parse("kafka://alice:s3cret@h1:9092,h2:9093/orders?group=billing&tiers=10m,1m&dlq=orders.dead&sasl=scram-sha-512&tls=true&commit_interval=50ms&poll_batch=500&fetch_max_bytes=4194304&fetch_max_partition_bytes=262144")
	cfg, err := ParseURL(u)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Brokers, []string{"h1:9092", "h2:9093"}) || cfg.Topic != "orders" || cfg.Group != "billing" ||
		cfg.DeadLetterTopic != "orders.dead" || cfg.TLS == nil || cfg.SASL == nil || cfg.SASL.Name() != "SCRAM-SHA-512" ||
		cfg.CommitInterval != 50*time.Millisecond || len(cfg.RetryTiers) != 2 || cfg.PollBatch != 500 || cfg.FetchMaxBytes != 4<<20 || cfg.FetchMaxPartitionBytes != 256<<10 {
		t.Fatalf("parsed %+v", cfg)
	}
	if got := cfg.withDefaults().retryTopics(); !slices.Equal(got, []string{"orders.retry.1m", "orders.retry.10m"}) {
		t.Fatalf("retry topics %v", got)
	}
	// -1 means "do not wait" in SourceConfig.RevokeTimeout; so it does in the URL.
	u, _ = url.Parse("kafka://h1:9092/orders?revoke_timeout=-1")
	if cfg, err := ParseURL(u); err != nil || cfg.RevokeTimeout != -1 {
		t.Fatalf("revoke_timeout=-1: %v, %v", cfg.RevokeTimeout, err)
	}
	bad := []string{
		"kafka://alice:s3cret@h1:9092/orders?sasl=kerberos",
		"kafka://alice:s3cret@h1:9092/orders",
		"kafka://h1:9092/orders?tiers=soon",
		"kafka://h1:9092/",
		"kafka:///orders",
		"kafka://h1:9092/orders?tls=maybe",
		"kafka://alice:s3cret@h1:9092/orders?sasl=plain&tier=1m", // misspelt: not ignored
		"kafka://h1:9092/orders?group=a&group=b",
		"kafka://h1:9092/orders?poll_batch=-1",
		"kafka://h1:9092/orders?fetch_max_bytes=3000000000",
		"kafka://h1:9092/orders?fetch_max_bytes=lots",
		"kafka://h1:9092/orders?fetch_max_partition_bytes=-1",
		"kafka://h1:9092/orders?fetch_max_partition_bytes=3000000000",
		// Malformed pairs are an error, not dropped (url.Values would drop them).
		"kafka://alice:s3cret@h1:9092/orders?sasl=plain&group=g&tiers=1m;dlq=orders.dead",
		"kafka://h1:9092/orders?group=g&dlq=orders%zzdead",
		"kafka://h1:9092/orders?group=g&tls=true&tls_ca=%zz",
		// An explicit tls=false is not overridden by a TLS setting.
		"kafka://h1:9092/orders?tls=false&tls_server_name=kafka.internal",
		"kafka://h1:9092/orders?revoke_timeout=-2",
		// An empty value is a mistake, not the default.
		"kafka://h1:9092/orders?group=g&tiers=",
		"kafka://h1:9092/orders?group=g&dlq=",
		"kafka://h1:9092/orders?group=g&retry_prefix=",
		// A user without sasl would be ignored.
		"kafka://alice@h1:9092/orders?group=g",
		// sasl with a user but no password failed only when connecting.
		"kafka://alice@h1:9092/orders?group=g&sasl=plain",
		"kafka://alice@h1:9092/orders?group=g&sasl=scram-sha-256",
	}
	for _, raw := range bad {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		_, err = ParseURL(u)
		if err == nil {
			t.Errorf("%s: no error", u.Redacted())
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("error leaks the password: %v", err)
		}
	}
}

// TestCreateTopicsRejectsBadChain: CreateTopics validates the tiers and the
// dead-letter topic it creates topics for; before, a negative tier created a
// topic named orders.retry.-1s.
func TestCreateTopicsRejectsBadChain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// No broker is contacted: validation fails first.
	cfg := SourceConfig{ClientConfig: ClientConfig{Brokers: []string{"127.0.0.1:1"}}, Topic: "orders", RetryTiers: []time.Duration{-time.Second}}
	if err := CreateTopics(ctx, cfg, 1, 1); err == nil || !strings.Contains(err.Error(), "SourceConfig.RetryTiers has -1s") {
		t.Fatalf("CreateTopics with a negative tier: %v", err)
	}
}

// TestParseSinkURLRefusesSourceParameters: a sink uses only the brokers,
// the topic, client_id, TLS and SASL. Before, OpenSink took
// kafka://h/orders?group=g&tiers=1m as well and ignored both without a word.
func TestParseSinkURLRefusesSourceParameters(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"group=g", "tiers=1m", "retry_prefix=r.", "dlq=orders.dead", "commit_interval=1s", "revoke_timeout=1s",
		"start=latest", "poll_batch=10", "fetch_max_bytes=1024", "fetch_max_partition_bytes=1024",
		"session_timeout=10s", "rebalance_timeout=20s", "heartbeat_interval=1s"} {
		raw := "kafka://alice:s3cret@h1:9092/orders?sasl=plain&" + k
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseURL(u); err != nil {
			t.Errorf("ParseURL %s: %v", k, err)
		}
		name, _, _ := strings.Cut(k, "=")
		want := fmt.Sprintf("URL parameter %q is for a source; a sink URL does not take it", name)
		_, err = ParseSinkURL(u)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseSinkURL %s: %v, want an error containing %q (and no password)", k, err, want)
		}
		// A sink that is opened would dial h1:9092: bound it.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = adapters.OpenSink(ctx, raw)
		cancel()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("OpenSink %s: %v, want an error containing %q", k, err, want)
		}
	}
	u, _ := url.Parse("kafka://alice:s3cret@h1:9092,h2:9092/orders?sasl=scram-sha-256&tls=true&client_id=me")
	if cfg, err := ParseSinkURL(u); err != nil || cfg.Topic != "orders" || cfg.SASL == nil || cfg.TLS == nil || cfg.ClientID != "me" {
		t.Errorf("sink URL: %+v, %v", cfg, err)
	}
}

// TestEachConfigNamesItself: each constructor has its config, and a
// validation error names the field of the config the caller filled in.
func TestEachConfigNamesItself(t *testing.T) {
	ctx := context.Background()
	client := ClientConfig{Brokers: []string{"127.0.0.1:1"}} // never dialled: validation fails first
	for want, open := range map[string]func() error{
		"ShareConfig.Group is empty": func() error {
			_, err := NewShareSource(ctx, ShareConfig{ClientConfig: client, Topic: "t"})
			return err
		},
		`ShareConfig.DeadLetterTopic = "t"`: func() error {
			_, err := NewShareSource(ctx, ShareConfig{ClientConfig: client, Topic: "t", Group: "g", DeadLetterTopic: "t"})
			return err
		},
		"SinkConfig.Topic is empty": func() error {
			_, err := NewSink(ctx, SinkConfig{ClientConfig: client})
			return err
		},
		"SinkConfig.Brokers is empty": func() error {
			_, err := NewSink(ctx, SinkConfig{Topic: "t"})
			return err
		},
		"TransactConfig.PollBatch = -1": func() error {
			_, err := NewTransactSession(ctx, TransactConfig{ClientConfig: client, Topic: "t", Group: "g", TransactionalID: "x", PollBatch: -1})
			return err
		},
		"TransactConfig.TransactionalID is empty": func() error {
			_, err := NewTransactSession(ctx, TransactConfig{ClientConfig: client, Topic: "t", Group: "g"})
			return err
		},
		"SourceConfig.StartOffset": func() error {
			_, err := NewSource(ctx, SourceConfig{ClientConfig: client, Topic: "t", Group: "g", StartOffset: "now"})
			return err
		},
	} {
		if err := open(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want one containing %q", err, want)
		}
	}
}
