package gcppubsub

import (
	"context"
	"crypto/tls"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	tnoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/api/option"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

func mustURL(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestConfigFromURL(t *testing.T) {
	cfg, err := ConfigFromURL(mustURL(t, "gcppubsub://projects/p1/subscriptions/s1?dead_letter_topic=projects/p2/topics/dl&max_outstanding=7&ack_deadline=30s&max_extension=10m&emulator=localhost:8085&max_attempts=7&handler_timeout=30s&streams=4"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Retry.MaxAttempts != 7 || cfg.HandlerTimeout != 30*time.Second || cfg.Streams != 4 {
		t.Fatalf("max_attempts %d handler_timeout %v", cfg.Retry.MaxAttempts, cfg.HandlerTimeout)
	}
	// Without dead_letter_topic: broker-managed dead letters.
	if cfg, err := ConfigFromURL(mustURL(t, "gcppubsub://projects/p/subscriptions/s?max_attempts=-1")); err != nil || cfg.DeadLetterTopic != "" || cfg.Retry.MaxAttempts != -1 {
		t.Fatalf("%+v, %v", cfg, err)
	}
	want := Config{Project: "p1", Subscription: "s1", DeadLetterTopic: "projects/p2/topics/dl", MaxOutstandingMessages: 7, AckDeadline: 30 * time.Second, MaxExtension: 10 * time.Minute, Emulator: "localhost:8085"}
	if cfg.Project != want.Project || cfg.Subscription != want.Subscription || cfg.DeadLetterTopic != want.DeadLetterTopic ||
		cfg.MaxOutstandingMessages != want.MaxOutstandingMessages || cfg.AckDeadline != want.AckDeadline || cfg.MaxExtension != want.MaxExtension ||
		cfg.Emulator != want.Emulator || cfg.Endpoint != "" {
		t.Fatalf("got %+v, want %+v", cfg, want)
	}
	sc, err := SinkConfigFromURL(mustURL(t, "gcppubsub://projects/p1/topics/t1?endpoint=europe-west1-pubsub.googleapis.com:443"))
	if err != nil {
		t.Fatal(err)
	}
	if sc.Project != "p1" || sc.Topic != "t1" || sc.Endpoint != "europe-west1-pubsub.googleapis.com:443" {
		t.Fatalf("sink config %+v", sc)
	}
}

func TestURLErrors(t *testing.T) {
	t.Setenv(EmulatorHostEnv, "")
	for _, c := range []struct {
		raw  string
		sink bool
		want string // in the error
	}{
		{raw: "gcppubsub://projects/p/subscriptions/s?streams=65", want: `"streams" = "65": want an integer in [1, 64]`},
		{raw: "gcppubsub://projects/p/subscriptions/s?max_attempts=0", want: `"max_attempts" = "0": want at least 1, or -1`},
		{raw: "gcppubsub://projects/p/subscriptions/s?max_attempts=-2", want: `"max_attempts" = "-2"`},
		{raw: "gcppubsub://projects/p/subscriptions/s?handler_timeout=0s", want: `"handler_timeout" = "0s"`},
		{raw: "gcppubsub://projects/p/topics/t?dead_letter_topic=d", sink: true, want: `"dead_letter_topic" is for a source`},
		{raw: "gcppubsub://projects/p/topics/t?dead_letter_topic=d", want: "not of the form gcppubsub://projects/<project>/subscriptions/<subscription>"},
		{raw: "gcppubsub://projects/p/subscriptions/s", sink: true, want: "not of the form gcppubsub://projects/<project>/topics/<topic>"},
		{raw: "gcppubsub://projects//subscriptions/s?dead_letter_topic=d", want: "not of the form"},
		{raw: "gcppubsub://projects/p/subscriptions/s/x?dead_letter_topic=d", want: "not of the form"},
		{raw: "gcppubsub://projects/p/subscriptions/s?dead_letter_topic=a/b", want: `"dead_letter_topic" = "a/b": want a topic ID`},
		{raw: "gcppubsub://projects/p/subscriptions/s?dead_letter_topic=d&bogus=1", want: `"bogus" is unknown`},
		{raw: "gcppubsub://projects/p/subscriptions/s?dead_letter_topic=d&ack_deadline=5s", want: `"ack_deadline" = "5s"`},
		{raw: "gcppubsub://projects/p/subscriptions/s?dead_letter_topic=d&ack_deadline=10500ms", want: "whole number of seconds"},
		{raw: "gcppubsub://projects/p/subscriptions/s?dead_letter_topic=d&max_outstanding=0", want: `"max_outstanding" = "0"`},
		{raw: "gcppubsub://projects/p/topics/t?endpoint=a:1&emulator=b:2", sink: true, want: `"endpoint" cannot go with emulator=`},
		{raw: "gcppubsub://me:hunter2@projects/p/topics/t", sink: true, want: "credentials come from the default chain"},
		{raw: "amqp://projects/p/topics/t", sink: true, want: `scheme "amqp"`},
	} {
		u := mustURL(t, c.raw)
		var err error
		if c.sink {
			_, err = SinkConfigFromURL(u)
		} else {
			_, err = ConfigFromURL(u)
		}
		if err == nil || !errors.Is(err, adapters.ErrBadURL) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: %v, want adapters.ErrBadURL with %q", c.raw, err, c.want)
		}
	}
}

// endpoint= beside PUBSUB_EMULATOR_HOST is refused: the Google client
// would mix the emulator's plaintext, credential-less connection with it.
func TestEndpointBesideEmulatorEnv(t *testing.T) {
	t.Setenv(EmulatorHostEnv, "localhost:8085")
	_, err := SinkConfigFromURL(mustURL(t, "gcppubsub://projects/p/topics/t?endpoint=a:443"))
	if !errors.Is(err, adapters.ErrBadURL) || !strings.Contains(err.Error(), EmulatorHostEnv) {
		t.Fatalf("got %v", err)
	}
}

func TestOpenOptionsRefused(t *testing.T) {
	ctx := context.Background()
	type otherKey struct{}
	for name, opt := range map[string]adapters.OpenOption{
		"WithMeterProvider":  adapters.WithMeterProvider(noop.NewMeterProvider()),
		"WithTracerProvider": adapters.WithTracerProvider(tnoop.NewTracerProvider()),
		"WithTLSConfig":      adapters.WithTLSConfig(&tls.Config{}),
		"adapter option":     adapters.WithAdapterOption(otherKey{}, 1),
	} {
		if _, err := adapters.OpenSource(ctx, "gcppubsub://projects/p/subscriptions/s?dead_letter_topic=d&emulator=127.0.0.1:1", opt); !errors.Is(err, adapters.ErrUnsupportedOption) || !strings.Contains(err.Error(), name) {
			t.Errorf("source with %s: %v, want ErrUnsupportedOption naming it", name, err)
		}
		if _, err := adapters.OpenSink(ctx, "gcppubsub://projects/p/topics/t?emulator=127.0.0.1:1", opt); !errors.Is(err, adapters.ErrUnsupportedOption) || !strings.Contains(err.Error(), name) {
			t.Errorf("sink with %s: %v, want ErrUnsupportedOption naming it", name, err)
		}
	}
}

// A source and a sink opened by URL work on pstest: through emulator=, and
// through PUBSUB_EMULATOR_HOST as the Google client reads it; the options
// (a logger, client options) are taken.
func TestOpenByURL(t *testing.T) {
	f := newFake(t)
	d := f.create(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t.Setenv(EmulatorHostEnv, f.srv.Addr)
	sink, err := adapters.OpenSink(ctx, "gcppubsub://projects/"+testProject+"/topics/"+d.topic, WithClientOptions(option.WithUserAgent("ackwise-test")))
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	if err := sink.Publish(ctx, &ackwise.Message{ID: "ev-1", Payload: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EmulatorHostEnv, "")
	src, err := adapters.OpenSource(ctx, "gcppubsub://projects/"+testProject+"/subscriptions/"+d.sub+"?dead_letter_topic="+d.dlTopic+"&emulator="+f.srv.Addr, adapters.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	buf := make([]*ackwise.Message, 1)
	if n, err := src.Receive(ctx, buf); n != 1 || err != nil {
		t.Fatalf("receive: %d %v", n, err)
	}
	if m := buf[0]; m.ID != "ev-1" || string(m.Payload) != "hello" || m.Attempt != 1 || m.Source != "projects/"+testProject+"/subscriptions/"+d.sub {
		t.Fatalf("received %+v", m)
	}
	if err := src.Ack(ctx, buf[0]); err != nil {
		t.Fatal(err)
	}
}
