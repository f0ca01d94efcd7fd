package sqs

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// TestAckBatchPerEntry: one DeleteMessageBatch call whose entry for one
// message SQS refuses (its receipt expired: made visible again behind the
// source's back) fails that message's ack alone, with
// adapters.ErrReceiptInvalid; the other is deleted. On a FIFO queue: the
// emulator checks receipts there as AWS documents, and is lenient on a
// standard queue.
func TestAckBatchPerEntry(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	q := createQueue(t, c, "perentry", 0, true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sink, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: testConn(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Publish(ctx, &ackwise.Message{ID: "a", Key: "ka", Payload: []byte("a")}, &ackwise.Message{ID: "b", Key: "kb", Payload: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(ctx, Config{QueueURL: q, Connection: testConn(t), WaitTime: -1, AckLinger: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	got := map[string]*ackwise.Message{}
	buf := make([]*ackwise.Message, 2)
	for len(got) < 2 {
		n, err := src.Receive(ctx, buf)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range buf[:n] {
			got[m.ID] = m
		}
	}
	a, b := got["a"], got["b"]
	if _, err := c.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(q), ReceiptHandle: aws.String(a.Handle.(*receipt).handle), VisibilityTimeout: 0}); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 2)
	src.AckBatch(ctx, []*ackwise.Message{a, b}, errs)
	if !errors.Is(errs[0], adapters.ErrReceiptInvalid) || errs[1] != nil {
		t.Fatalf("AckBatch = %v, want [ErrReceiptInvalid, nil]", errs)
	}
	if src.Valid(a) || src.Valid(b) {
		t.Errorf("Valid after the acks: %v %v", src.Valid(a), src.Valid(b))
	}
	again := make([]*ackwise.Message, 2)
	n, err := src.Receive(ctx, again)
	if err != nil || n != 1 || again[0].ID != "a" {
		t.Fatalf("after the acks received %d (%v), want a alone", n, err)
	}
}

// TestPublishPerEntry: a SendMessageBatch call whose entry for one message
// SQS refuses (larger than the queue's MaximumMessageSize, lowered after
// the sink read it) fails that message alone, as a permanent error (the
// sender's fault), and the others are sent.
func TestPublishPerEntry(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	q := createQueue(t, c, "sendentry", 0, false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sink, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: testConn(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{QueueUrl: aws.String(q), Attributes: map[string]string{"MaximumMessageSize": "1024"}}); err != nil {
		t.Fatal(err)
	}
	msgs := []*ackwise.Message{{ID: "s1", Payload: []byte("small")}, {ID: "big", Payload: []byte(strings.Repeat("x", 4096))}, {ID: "s2", Payload: []byte("small")}}
	err = sink.Publish(ctx, msgs...)
	pe, ok := errors.AsType[*adapters.PublishError](err)
	if !ok || len(pe.Failed) != 1 || pe.Failed[0].Index != 1 || ackwise.ClassOf(pe.Failed[0].Err) != ackwise.ClassPermanent {
		t.Fatalf("Publish = %v, want a PublishError listing msgs[1] alone, permanent", err)
	}
	var ids []string
	for _, m := range drain(ctx, t, c, q) {
		ids = append(ids, m.ID)
	}
	if len(ids) != 2 {
		t.Fatalf("queue holds %v, want s1 and s2", ids)
	}
}

// TestPublishFIFOGroupHeld: on a FIFO queue, once a message of a group
// failed, the later ones of the group in the call are not sent (they would
// overtake it); the other groups' are.
func TestPublishFIFOGroupHeld(t *testing.T) {
	t.Parallel()
	c := testClient(t)
	q := createQueue(t, c, "groupheld", 0, true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sink, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: testConn(t)})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []*ackwise.Message{
		{ID: "a", Key: "g1", Payload: []byte("a")},
		{ID: "big", Key: "g1", Payload: make([]byte, sink.maxSize+1)},
		{ID: "c", Key: "g1", Payload: []byte("c")},
		{ID: "d", Key: "g2", Payload: []byte("d")},
		{Key: "g3", Payload: []byte("no event ID")},
	}
	err = sink.Publish(ctx, msgs...)
	failures := adapters.PublishFailures(err, len(msgs))
	if len(failures) != 3 || failures[0].Index != 1 || !errors.Is(failures[0].Err, ErrTooLarge) ||
		failures[1].Index != 2 || !errors.Is(failures[1].Err, ErrGroupHeld) || failures[2].Index != 4 || !errors.Is(failures[2].Err, ErrNoEventID) {
		t.Fatalf("Publish = %v, want msgs[1] too large, msgs[2] held, msgs[4] without an event ID", err)
	}
	var ids []string
	for _, m := range drain(ctx, t, c, q) {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "a,d" {
		t.Fatalf("queue holds %v, want a and d", ids)
	}
}
