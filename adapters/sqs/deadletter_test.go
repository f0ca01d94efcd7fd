package sqs

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
	"github.com/ackwise/ackwise/internal/logbuf"
)

// TestDeadLetterTrimmed: a message that the envelope takes over the
// dead-letter queue's MaximumMessageSize is dead-lettered with its payload
// cut (a text payload at a rune boundary, a binary one base64-encoded) and
// marked (dlq.HeaderTrimmed, dlq.PayloadCut), its headers and envelope
// whole: it is not refused for ever.
func TestDeadLetterTrimmed(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	conn := testConn(t)
	q := createQueue(t, c, "trim", 0, false)
	dq := createQueue(t, c, "trim-dlq", 0, false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{QueueUrl: aws.String(dq), Attributes: map[string]string{"MaximumMessageSize": "1024"}}); err != nil {
		t.Fatal(err)
	}
	sink, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: conn})
	if err != nil {
		t.Fatal(err)
	}
	text := []byte(strings.Repeat("é", 450)) // 900 bytes
	bin := bytes.Repeat([]byte{0xff, 0}, 400)
	in := []*ackwise.Message{
		{ID: "text", Payload: text, Headers: ackwise.HeadersOf("x-tenant", "acme")},
		{ID: "bin", Payload: bin, Headers: ackwise.HeadersOf("x-tenant", "acme")},
	}
	if err := sink.Publish(ctx, in...); err != nil {
		t.Fatal(err)
	}
	var logged logbuf.Buffer
	src, err := NewSource(ctx, Config{QueueURL: q, DeadLetterQueueURL: dq, Connection: conn, WaitTime: -1, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	buf := make([]*ackwise.Message, 2)
	for got := 0; got < 2; {
		n, err := src.Receive(ctx, buf)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range buf[:n] {
			env := dlq.New(m, dlq.ReasonPermanent, errors.New(strings.Repeat("e", 100)), ackwise.ClassPermanent, time.Now(), "billing", "v1")
			if err := src.DeadLetter(ctx, m, env); err != nil {
				t.Fatalf("dead-letter %s: %v", m.ID, err)
			}
		}
		got += n
	}
	if n := strings.Count(logged.String(), "payload cut"); n != 2 {
		t.Errorf("%d warnings of a cut payload, want 2:\n%s", n, logged.String())
	}
	want := map[string][]byte{"text": text, "bin": bin}
	dead := drain(ctx, t, c, dq)
	if len(dead) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dead))
	}
	for _, d := range dead {
		orig := want[d.ID]
		env, err := dlq.Decode(d.Headers)
		switch {
		case err != nil || env.Reason != dlq.ReasonPermanent || d.Headers.Get("x-tenant") != "acme":
			t.Errorf("%s: envelope %+v %v, headers %v", d.ID, env, err, d.Headers)
		case !dlq.PayloadCut(d.Headers) || !strings.HasPrefix(d.Headers.Get(dlq.HeaderTrimmed), "value-bytes="):
			t.Errorf("%s: marker %q", d.ID, d.Headers.Get(dlq.HeaderTrimmed))
		case len(d.Payload) == 0 || !bytes.HasPrefix(orig, d.Payload):
			t.Errorf("%s: payload %d bytes, not a prefix of the original", d.ID, len(d.Payload))
		case d.ID == "text" && !utf8.Valid(d.Payload):
			t.Errorf("text payload cut inside a rune")
		}
	}
}
