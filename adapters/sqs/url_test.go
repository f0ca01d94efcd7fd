package sqs

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/dlq"
)

func TestConfigFromURL(t *testing.T) {
	for _, c := range []struct {
		url  string
		want Config
	}{
		{"awssqs://sqs.us-east-2.amazonaws.com/99999/my-queue?region=us-east-2", Config{QueueURL: "https://sqs.us-east-2.amazonaws.com/99999/my-queue", Connection: Connection{Region: "us-east-2"}}},
		{"awssqs://127.0.0.1:9324/1/orders?endpoint=http://127.0.0.1:9324&dlq=orders-dlq&wait=1s&visibility=30s&ack_linger=-1", Config{
			QueueURL: "https://127.0.0.1:9324/1/orders", DeadLetterQueueURL: "https://127.0.0.1:9324/1/orders-dlq",
			Connection: Connection{Endpoint: "http://127.0.0.1:9324"}, WaitTime: time.Second, VisibilityTimeout: 30 * time.Second, AckLinger: -1,
		}},
		{"awssqs://h/1/q.fifo?dlq=https://h/2/d.fifo&wait=-1&ack_linger=0s", Config{QueueURL: "https://h/1/q.fifo", DeadLetterQueueURL: "https://h/2/d.fifo", WaitTime: -1, AckLinger: -1}},
		{"awssqs://h/1/q?dlq_mode=broker&max_attempts=4", Config{QueueURL: "https://h/1/q", DeadLetters: DeadLetterBroker, MaxAttempts: 4}},
		{"awssqs://h/1/q?dlq=d&dlq_mode=ACKWISE", Config{QueueURL: "https://h/1/q", DeadLetterQueueURL: "https://h/1/d", DeadLetters: DeadLetterAckwise}},
	} {
		u, _ := url.Parse(c.url)
		got, err := ConfigFromURL(u)
		if err != nil {
			t.Errorf("%s: %v", c.url, err)
			continue
		}
		if got != c.want {
			t.Errorf("%s:\n got %+v\nwant %+v", c.url, got, c.want)
		}
	}
	if got := regionOf("https://sqs.eu-west-1.amazonaws.com/1/q"); got != "eu-west-1" {
		t.Errorf("regionOf = %q", got)
	}
}

// TestURLErrors: each bad URL is refused naming what is wrong, matching
// adapters.ErrBadURL, without the password.
func TestURLErrors(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"awssqs://h/1/q?colour=blue", `"colour" is unknown`},
		{"awssqs://h/1/q?dlq_mode=sqs", `"dlq_mode" = "sqs"`},
		{"awssqs://h/1/q?dlq=d&dlq_mode=broker", `"dlq_mode" = "broker": broker takes no dlq=`},
		{"awssqs://h/1/q?dlq_mode=broker&max_attempts=0", `"max_attempts" = "0"`},
		{"awssqs://h/1/q?max_attempts=1001", `"max_attempts" = "1001"`},
		{"awssqs://h/1/q?wait=1500ms", `"wait" = "1500ms": want whole seconds`},
		{"awssqs://h/1/q?wait=21s", `"wait" = "21s"`},
		{"awssqs://h/1/q?visibility=13h", `"visibility" = "13h"`},
		{"awssqs://h/1/q?dlq=q", `"dlq" = "q": is the queue itself`},
		{"awssqs://h/1/q?dlq=bad%20name", `"dlq" = "bad name"`},
		{"awssqs://h/1/q?dlq=https://u:S3CRET%40h/1/d", `"dlq" is not a queue name`},
		{"awssqs://h/1/q?endpoint=ftp://h", `"endpoint" is not an http`},
		{"awssqs://h/1/q?endpoint=http://u:S3CRET%40h", `"endpoint" holds user info`},
		{"awssqs://u:S3CRET@h/1/q", "holds user info (not shown)"},
		{"awssqs://u:1234?S3CRET@h/1/q", "not shown"},
		{"awssqs://h/", "names no queue"},
		{"awssqs://h/1/bad.name", `queue "bad.name"`},
		{"awssqs:///1/q", "has no host"},
		{"awssqs://h/1/q?region=", `"region" is empty`},
	} {
		u, err := url.Parse(c.url)
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		_, err = ConfigFromURL(u)
		if err == nil || !errors.Is(err, adapters.ErrBadURL) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "S3CRET") {
			t.Errorf("%s: %v, want an ErrBadURL saying %s (and no password)", c.url, err, c.want)
		}
	}
	for _, p := range []string{"dlq=d", "dlq_mode=broker", "max_attempts=3"} {
		u, _ := url.Parse("awssqs://h/1/q?" + p)
		name, _, _ := strings.Cut(p, "=")
		if _, err := SinkConfigFromURL(u); err == nil || !strings.Contains(err.Error(), `"`+name+`" is for a source`) {
			t.Errorf("sink with %s: %v", p, err)
		}
	}
}

// TestOpenOptionsRefused: the options the adapter cannot use are refused
// before anything is dialled.
func TestOpenOptionsRefused(t *testing.T) {
	ctx := context.Background()
	const u = "awssqs://h/1/q"
	for name, err := range map[string]error{
		"meter": func() error {
			_, err := adapters.OpenSource(ctx, u, adapters.WithMeterProvider(noop.NewMeterProvider()))
			return err
		}(),
		"logger": func() error { _, err := adapters.OpenSink(ctx, u, adapters.WithLogger(slog.Default())); return err }(),
		"other": func() error {
			_, err := adapters.OpenSink(ctx, u, adapters.WithAdapterOption(struct{}{}, 1))
			return err
		}(),
	} {
		if !errors.Is(err, adapters.ErrUnsupportedOption) {
			t.Errorf("%s: %v, want ErrUnsupportedOption", name, err)
		}
	}
}

// TestURLParametersDocumented: docs/sqs.md holds the table of the URL
// parameters as the parser's table gives it.
func TestURLParametersDocumented(t *testing.T) {
	if err := params.DocumentedIn("../../docs/sqs.md"); err != nil {
		t.Error(err)
	}
}

// TestOpenByURL: a source and a sink opened by awssqs:// URL with the
// emulator's endpoint, the source with dlq= by name, move a message and
// dead-letter another.
func TestOpenByURL(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	endpoint := needSQS(t)
	q := createQueue(t, c, "byurl", 0, false)
	dq := createQueue(t, c, "byurl-dlq", 0, false)
	qu, _ := url.Parse(q)
	raw := "awssqs://" + qu.Host + qu.Path + "?endpoint=" + url.QueryEscape(endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sink, err := adapters.OpenSink(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	src, err := adapters.OpenSource(ctx, raw+"&wait=1s&dlq="+queueName(dq), adapters.WithLogger(slog.Default()))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := sink.Publish(ctx, &ackwise.Message{ID: "a", Payload: []byte("one")}, &ackwise.Message{ID: "b", Payload: []byte("two")}); err != nil {
		t.Fatal(err)
	}
	buf := make([]*ackwise.Message, 2)
	got := map[string]*ackwise.Message{}
	for len(got) < 2 {
		n, err := src.Receive(ctx, buf)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range buf[:n] {
			got[m.ID] = m
		}
	}
	if err := src.Ack(ctx, got["a"]); err != nil {
		t.Fatal(err)
	}
	env := dlq.New(got["b"], dlq.ReasonPermanent, errors.New("bad"), ackwise.ClassPermanent, time.Now(), "c", "v1")
	if err := src.DeadLetter(ctx, got["b"], env); err != nil {
		t.Fatal(err)
	}
	dead := drain(ctx, t, c, dq)
	if len(dead) != 1 || dead[0].ID != "b" || string(dead[0].Payload) != "two" || dead[0].Headers.Get(dlq.HeaderReason) != "permanent" {
		t.Fatalf("dead letters %+v", dead)
	}
}
