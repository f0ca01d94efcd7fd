package sqs

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/ackwise/ackwise"
)

// manyHeaders are headers no set of 10 attributes carries: more than 10,
// a binary value, an empty one, a repeated name, names SQS refuses.
func manyHeaders() ackwise.Headers {
	h := ackwise.HeadersOf(ackwise.HeaderEventID, "ev-1", "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	for i := range 12 {
		h.Add(fmt.Sprintf("x-h%02d", i), fmt.Sprint("v", i))
	}
	h.Add("x-bin", "\x00\xff\xfe")
	h.Add("x-empty", "")
	h.Add("x-h00", "again")
	h.Add("AWS.reserved", "a")
	h.Add("bad name", "b")
	h.Add("x-\xff", "\uffff")
	return h
}

// TestAttributesRoundTrip: what encodeAttributes writes, decodeAttributes
// reads back: every header (order aside), the key, the body encoding;
// within 10 attributes, the event ID and traceparent among them.
func TestAttributesRoundTrip(t *testing.T) {
	for _, h := range []ackwise.Headers{nil, ackwise.HeadersOf("a", "1"), manyHeaders()} {
		attrs := encodeAttributes("key-1", h, encBase64)
		if len(attrs) > MaxAttributes {
			t.Fatalf("%d attributes", len(attrs))
		}
		if len(h) > 9 {
			for _, k := range []string{ackwise.HeaderKey, AttrBodyEncoding, ackwise.HeaderEventID, ackwise.HeaderTraceparent} {
				if _, ok := attrs[k]; !ok {
					t.Errorf("%s not an attribute of its own", k)
				}
			}
		}
		got, key, enc := decodeAttributes(attrs)
		if key != "key-1" || enc != encBase64 {
			t.Errorf("key %q enc %q", key, enc)
		}
		want := append(ackwise.Headers{{Key: ackwise.HeaderKey, Value: "key-1"}}, h...)
		if !sameHeaders(got, want) {
			t.Errorf("headers\n got %q\nwant %q", got, want)
		}
	}
	// Hop headers are dropped.
	got, _, _ := decodeAttributes(encodeAttributes("", ackwise.HeadersOf(ackwise.HeaderAttempt, "4", "x", "y"), ""))
	if !sameHeaders(got, ackwise.HeadersOf("x", "y")) {
		t.Errorf("hop headers kept: %q", got)
	}
}

// sameHeaders compares headers as multisets.
func sameHeaders(a, b ackwise.Headers) bool {
	key := func(h ackwise.Headers) []string {
		var s []string
		for _, kv := range h {
			s = append(s, kv.Key+"\x00"+kv.Value)
		}
		slices.Sort(s)
		return s
	}
	return slices.Equal(key(a), key(b))
}

func TestBodyRoundTrip(t *testing.T) {
	for _, p := range [][]byte{{}, []byte("plain text\n\twith é"), {0, 0xff}, []byte("\x01ctl"), []byte("\uFFFF")} {
		body, enc := encodeBody(p)
		if body == "" || !sqsText(body) {
			t.Errorf("%q: body %q not text SQS takes", p, body)
		}
		if got := decodeBody(body, enc); !bytes.Equal(got, p) {
			t.Errorf("%q: round trip %q", p, got)
		}
	}
	if got := decodeBody("not base64!", encBase64); string(got) != "not base64!" {
		t.Errorf("a forged encoding: %q", got)
	}
	h, _, _ := decodeAttributes(encodeAttributes("", nil, "")) // nothing
	if len(h) != 0 {
		t.Errorf("%q", h)
	}
}

// TestHeadersThroughSQS: the headers no 10 attributes carry, a binary
// payload and a FIFO queue's group and deduplication IDs, through the
// emulator: the sink sends, the source receives them whole; the raw
// message, read with the SDK, has at most 10 attributes.
func TestHeadersThroughSQS(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	conn := testConn(t)
	for _, fifo := range []bool{false, true} {
		q := createQueue(t, c, "headers", 0, fifo)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		sink, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: conn})
		if err != nil {
			t.Fatal(err)
		}
		in := &ackwise.Message{ID: "ev-1", Key: "k", Payload: []byte{0, 1, 0xff}, Headers: manyHeaders()}
		if err := sink.Publish(ctx, in); err != nil {
			t.Fatal(err)
		}
		src, err := NewSource(ctx, Config{QueueURL: q, Connection: conn, WaitTime: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		buf := make([]*ackwise.Message, 1)
		if _, err := src.Receive(ctx, buf); err != nil {
			t.Fatal(err)
		}
		got := buf[0]
		want := append(ackwise.Headers{{Key: ackwise.HeaderKey, Value: "k"}}, in.Headers...)
		if got.ID != "ev-1" || got.Key != "k" || !bytes.Equal(got.Payload, in.Payload) || !sameHeaders(got.Headers, want) {
			t.Errorf("fifo %v: got ID %q key %q payload %q headers %q", fifo, got.ID, got.Key, got.Payload, got.Headers)
		}
		if err := src.Release(ctx, got); err != nil {
			t.Fatal(err)
		}
		raw, err := c.ReceiveMessage(ctx, &awsReceive(q).ReceiveMessageInput)
		if err != nil || len(raw.Messages) != 1 {
			t.Fatalf("raw receive: %v %v", raw, err)
		}
		m := raw.Messages[0]
		if n := len(m.MessageAttributes); n > MaxAttributes {
			t.Errorf("%d attributes", n)
		}
		if fifo && (m.Attributes["MessageGroupId"] != "k" || m.Attributes["MessageDeduplicationId"] != "ev-1") {
			t.Errorf("group %q dedup %q, want k and ev-1", m.Attributes["MessageGroupId"], m.Attributes["MessageDeduplicationId"])
		}
		if aws.ToString(m.MessageAttributes[ackwise.HeaderEventID].StringValue) != "ev-1" {
			t.Errorf("event ID attribute %v", m.MessageAttributes[ackwise.HeaderEventID])
		}
	}
}

// TestVisibilityCap: a delay is rounded up to whole seconds and cut to
// what is left of the 12 hours SQS keeps a message invisible from its
// receive (rounded down, less the lease's margin).
func TestVisibilityCap(t *testing.T) {
	s := &Source{epoch: time.Now().Add(-MaxVisibility), margin: time.Second}
	for _, c := range []struct {
		received time.Duration // since the source's epoch
		d        time.Duration
		want     int32
	}{
		{MaxVisibility, 0, 0},
		{MaxVisibility, 300 * time.Millisecond, 1},
		{MaxVisibility, 30 * time.Second, 30},
		{MaxVisibility, 13 * time.Hour, 43200 - 2},
		{0, time.Hour, 0},                     // received 12 h ago: nothing left
		{time.Hour, 2 * time.Hour, 3600 - 2},  // received 11 h ago: 1 h left, less the margin
		{11 * time.Hour, 2 * time.Hour, 7200}, // received 1 h ago: 11 h left
	} {
		r := &receipt{s: s, received: c.received}
		if got := r.visibility(c.d); got < c.want-1 || got > c.want+1 {
			t.Errorf("received at %v, delay %v: %d s, want %d", c.received, c.d, got, c.want)
		}
	}
}
