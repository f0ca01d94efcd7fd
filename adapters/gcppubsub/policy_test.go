package gcppubsub

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/retry"
)

// recordLog is a slog handler keeping the records' messages, for tests
// that assert a warning.
type recordLog struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recordLog) Enabled(context.Context, slog.Level) bool { return true }
func (r *recordLog) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Level.String() + " " + rec.Message)
	rec.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, b.String())
	return nil
}
func (r *recordLog) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recordLog) WithGroup(string) slog.Handler      { return r }

func (r *recordLog) has(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// checkSubscription refuses a dead-letter policy that disagrees with
// ackwise's max attempts, naming both, in each dead-letter mode; warns
// when a fixed retry backoff cannot honour the consumer's delays, when
// max_extension is below the hold in place, and when there is no
// dead-letter destination at all.
func TestCheckSubscription(t *testing.T) {
	t.Parallel()
	dlp := func(n int32) *pubsubpb.Subscription {
		return &pubsubpb.Subscription{Name: "projects/p/subscriptions/s", DeadLetterPolicy: &pubsubpb.DeadLetterPolicy{DeadLetterTopic: "projects/p/topics/pdl", MaxDeliveryAttempts: n}}
	}
	fixed := &pubsubpb.Subscription{Name: "projects/p/subscriptions/s", RetryPolicy: &pubsubpb.RetryPolicy{MinimumBackoff: durationpb.New(30 * time.Second), MaximumBackoff: durationpb.New(30 * time.Second)}}
	for _, c := range []struct {
		name    string
		cfg     Config
		ps      *pubsubpb.Subscription
		wantErr []string // in the error; nil: no error
		warn    string   // in a logged record; "": none at Warn
	}{
		{name: "ackwise-managed, attempts below the policy", cfg: Config{DeadLetterTopic: "dl", Retry: retry.Policy{MaxAttempts: 3}}, ps: dlp(5)},
		{name: "ackwise-managed, attempts equal to the policy", cfg: Config{DeadLetterTopic: "dl"}, ps: dlp(5)},
		{name: "ackwise-managed, policy default 5 vs 6", cfg: Config{DeadLetterTopic: "dl", Retry: retry.Policy{MaxAttempts: 6}}, ps: dlp(0), wantErr: []string{"after 5 deliveries", "max attempts, 6", "at most 5"}},
		{name: "ackwise-managed, attempts above the policy", cfg: Config{DeadLetterTopic: "dl", Retry: retry.Policy{MaxAttempts: 10}}, ps: dlp(7), wantErr: []string{"after 7 deliveries", "max attempts, 10", "projects/p/topics/pdl"}},
		{name: "ackwise-managed, unlimited attempts", cfg: Config{DeadLetterTopic: "dl", Retry: retry.Policy{MaxAttempts: retry.Unlimited}}, ps: dlp(7), wantErr: []string{"unlimited"}},
		{name: "broker-managed, equal", cfg: Config{Retry: retry.Policy{MaxAttempts: 7}}, ps: dlp(7)},
		{name: "broker-managed, below", cfg: Config{Retry: retry.Policy{MaxAttempts: 3}}, ps: dlp(7), wantErr: []string{"broker-managed", "after 7 deliveries", "max attempts are 3"}},
		{name: "broker-managed, default 5 vs 10", cfg: Config{}, ps: dlp(10), wantErr: []string{"after 10 deliveries", "max attempts are 5"}},
		{name: "no dead-letter destination", cfg: Config{}, ps: &pubsubpb.Subscription{}, warn: "no dead-letter topic"},
		{name: "fixed backoff, no schedule of the consumer's", cfg: Config{DeadLetterTopic: "dl"}, ps: fixed},
		{name: "fixed backoff, the consumer's delays", cfg: Config{DeadLetterTopic: "dl", Retry: retry.Policy{InitialInterval: time.Second}}, ps: fixed, warn: "consumer_delays=[1s 2s 4s 8s]"},
		{name: "fixed backoff, tiers equal to it", cfg: Config{DeadLetterTopic: "dl", Retry: retry.Policy{Tiers: []time.Duration{30 * time.Second}}}, ps: fixed},
		{name: "max_extension below the hold in place", cfg: Config{DeadLetterTopic: "dl", HandlerTimeout: time.Minute, MaxExtension: 2 * time.Minute}, ps: &pubsubpb.Subscription{}, warn: "hold=5m22.5s"},
	} {
		cfg := c.cfg
		cfg.Project, cfg.Subscription = "p", "s"
		if err := cfg.validate(); err != nil {
			t.Fatalf("%s: validate: %v", c.name, err)
		}
		rec := &recordLog{}
		err := checkSubscription(cfg, c.ps, slog.New(rec))
		switch {
		case c.wantErr == nil && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.wantErr != nil && err == nil:
			t.Errorf("%s: nil error, want one with %q", c.name, c.wantErr)
		}
		for _, w := range c.wantErr {
			if err != nil && !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q lacks %q", c.name, err, w)
			}
		}
		if c.warn != "" && (!rec.has("WARN") || !rec.has(c.warn)) {
			t.Errorf("%s: logged %q, want a warning with %q", c.name, rec.msgs, c.warn)
		}
		if c.warn == "" && rec.has("WARN") {
			t.Errorf("%s: warned %q", c.name, rec.msgs)
		}
	}
}

// With a HandlerTimeout, a zero MaxExtension covers every attempt in
// place, and one below the timeout is refused naming both.
func TestMaxExtensionLinedUp(t *testing.T) {
	t.Parallel()
	cfg := Config{Project: "p", Subscription: "s", HandlerTimeout: 30 * time.Minute, Retry: retry.Policy{MaxAttempts: 3, InitialInterval: time.Minute, Jitter: retry.NoJitter}}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	if want := 90*time.Minute + 3*time.Minute; cfg.MaxExtension != want {
		t.Fatalf("MaxExtension %v, want %v (3 × 30m + 1m + 2m)", cfg.MaxExtension, want)
	}
	cfg = Config{Project: "p", Subscription: "s", HandlerTimeout: 10 * time.Minute, MaxExtension: 5 * time.Minute}
	if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), "MaxExtension 5m0s") || !strings.Contains(err.Error(), "HandlerTimeout 10m0s") {
		t.Fatalf("validate: %v", err)
	}
}

// dlPolicy returns a shape giving d's subscription a dead-letter policy
// to d's dead-letter topic after n deliveries.
func dlPolicy(n int32) func(*pubsubpb.Subscription) {
	return func(ps *pubsubpb.Subscription) {
		suffix := ps.Name[strings.LastIndex(ps.Name, "/s-")+3:]
		ps.DeadLetterPolicy = &pubsubpb.DeadLetterPolicy{DeadLetterTopic: "projects/" + testProject + "/topics/dlt-" + suffix, MaxDeliveryAttempts: n}
	}
}

// Broker-managed dead letters: without a dead-letter topic, DeadLetter
// fails (errors.ErrUnsupported) and the message handed back is delivered
// again with Pub/Sub's DeliveryAttempt as Attempt, until the subscription's
// dead-letter policy forwards it after MaxDeliveryAttempts deliveries, its
// data byte for byte.
func TestBrokerManagedDeadLetters(t *testing.T) {
	t.Parallel()
	payload := []byte{0x00, 0xff, 'p', 0x80}
	f, d := withMessages(t, dlPolicy(3), &ackwise.Message{ID: "ev", Payload: payload, Headers: ackwise.HeadersOf("x-tenant", "acme")})
	cfg := d.sourceConfig(f)
	cfg.DeadLetterTopic = ""
	cfg.Retry.MaxAttempts = 3
	src := openSource(t, f, cfg)
	if !src.Capabilities().DeliveryCount {
		t.Fatal("Capabilities.DeliveryCount false with a dead-letter policy")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for want := 1; want <= 3; want++ {
		m := receive(t, src)
		if m.Attempt != want {
			t.Fatalf("delivery %d: Attempt %d", want, m.Attempt)
		}
		if err := src.DeadLetter(ctx, m, dlq.Envelope{}); !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("DeadLetter, broker-managed: %v, want ErrUnsupported", err)
		}
		if err := src.Release(ctx, m); err != nil { // what the engine does next
			t.Fatal(err)
		}
	}
	dl := f.awaitDeadLetters(ctx, t, d, 1)
	if len(dl) != 1 || !bytes.Equal(dl[0].Payload, payload) || dl[0].ID != "ev" || dl[0].Headers.Get("x-tenant") != "acme" {
		t.Fatalf("dead letters %+v", dl)
	}
	for _, pm := range f.srv.Messages() {
		if pm.Topic == "projects/"+testProject+"/topics/"+d.topic && pm.Deliveries != 3 {
			t.Fatalf("the original was delivered %d times, want 3", pm.Deliveries)
		}
	}
}

// NewSource refuses an ackwise-managed source whose max attempts are above
// the subscription's MaxDeliveryAttempts, naming both.
func TestNewSourceRefusesAttemptsAbovePolicy(t *testing.T) {
	t.Parallel()
	f, d := withMessages(t, dlPolicy(5))
	cfg := d.sourceConfig(f)
	cfg.Retry.MaxAttempts = 8
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, err := NewSource(ctx, cfg)
	if err == nil {
		src.Close()
		t.Fatal("NewSource: nil error")
	}
	if !strings.Contains(err.Error(), "after 5 deliveries") || !strings.Contains(err.Error(), "max attempts, 8") {
		t.Fatalf("NewSource: %v", err)
	}
}

// TestConsumerChecksAttemptsAgainstPolicy: consumer.New checks the
// consumer's own max attempts against the subscription's dead-letter policy
// (adapters.AttemptsChecker), whatever the source was configured with: a
// source opened with max attempts 5 under a policy of 5 deliveries, given
// to a consumer retrying 8 times, is refused naming both; retrying 5 times
// is taken.
func TestConsumerChecksAttemptsAgainstPolicy(t *testing.T) {
	t.Parallel()
	f, d := withMessages(t, dlPolicy(5))
	cfg := d.sourceConfig(f)
	cfg.Retry.MaxAttempts = 5
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, err := NewSource(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	noop := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })
	_, err = consumer.New(src, noop, consumer.Config{Retry: retry.Policy{MaxAttempts: 8}})
	if err == nil || !strings.Contains(err.Error(), "after 5 deliveries") || !strings.Contains(err.Error(), "max attempts, 8") {
		t.Fatalf("consumer.New retrying 8 times: %v, want a refusal naming 5 and 8", err)
	}
	if _, err := consumer.New(src, noop, consumer.Config{Retry: retry.Policy{MaxAttempts: 5}}); err != nil {
		t.Fatalf("consumer.New retrying 5 times: %v", err)
	}
}
