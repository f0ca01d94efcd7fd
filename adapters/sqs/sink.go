package sqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
)

// maxSize reads the MaximumMessageSize of the queue at queueURL.
func maxSize(ctx context.Context, client *sqs.Client, queueURL string) (int, error) {
	const attr = types.QueueAttributeNameMaximumMessageSize
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queueURL), AttributeNames: []types.QueueAttributeName{attr}})
	if err != nil {
		return 0, fmt.Errorf("sqs: read the attributes of queue %s: %w", queueName(queueURL), err)
	}
	n, err := strconv.Atoi(out.Attributes[string(attr)])
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("sqs: queue %s has MaximumMessageSize %q", queueName(queueURL), out.Attributes[string(attr)])
	}
	return n, nil
}

// messageSize is the size SQS counts of a message: its body and its
// attributes' names, types and values.
func messageSize(body string, attrs map[string]types.MessageAttributeValue) int {
	size := len(body)
	for k, a := range attrs {
		size += len(k) + len(aws.ToString(a.DataType)) + len(aws.ToString(a.StringValue)) + len(a.BinaryValue)
	}
	return size
}

// MaxBatchBytes bounds the messages (bodies and attributes) of one
// SendMessageBatch call: SQS's limit of the sum of a batch's message sizes
// (256 KiB as documented when the adapter was written; a message larger
// than it is sent alone).
const MaxBatchBytes = 256 << 10

// ErrTooLarge is wrapped (as a permanent error) by the publish error of a
// message larger than the queue's MaximumMessageSize: it is not sent.
var ErrTooLarge = errors.New("sqs: message larger than the queue's MaximumMessageSize")

// ErrNoEventID is wrapped (as a permanent error) by the publish error of a
// message without an event ID to a FIFO queue, whose deduplication ID is
// the event ID: it is not sent.
var ErrNoEventID = errors.New("sqs: a message to a FIFO queue needs an event ID (its deduplication ID)")

// SinkConfig configures a Sink.
type SinkConfig struct {
	// QueueURL is the queue to send to. Required. A queue whose name ends
	// in ".fifo" is a FIFO queue: each message's group is its key (its
	// event ID without one) and its deduplication ID its event ID.
	QueueURL string
	// Connection says how to reach SQS (region, endpoint, TLS).
	Connection
}

// Sink sends messages to one SQS queue with SendMessageBatch.
type Sink struct {
	client   *sqs.Client
	queueURL string
	name     string
	fifo     bool
	maxSize  int
	closed   atomic.Bool
}

var _ adapters.Sink = (*Sink)(nil)

// NewSink opens a sink on cfg.QueueURL. It reads the queue's
// MaximumMessageSize, above which a message is refused before anything is
// sent.
func NewSink(ctx context.Context, cfg SinkConfig) (*Sink, error) {
	if err := checkQueueURL("SinkConfig.QueueURL", cfg.QueueURL); err != nil {
		return nil, err
	}
	client, err := cfg.Connection.newClient(ctx, cfg.QueueURL)
	if err != nil {
		return nil, err
	}
	s := &Sink{client: client, queueURL: cfg.QueueURL, name: queueName(cfg.QueueURL), fifo: isFIFO(cfg.QueueURL)}
	if s.maxSize, err = maxSize(ctx, client, s.queueURL); err != nil {
		return nil, err
	}
	return s, nil
}

// entry is one message of a Publish call, ready to send.
type entry struct {
	i    int
	e    types.SendMessageBatchRequestEntry
	size int
}

// Publish sends msgs with SendMessageBatch calls of up to 10 messages and
// MaxBatchBytes, one after the other in msgs' order, and reports per
// message (*adapters.PublishError). Each message carries its event ID
// (Message.EventID) as the ackwise-event-id attribute and its key as
// ackwise-key; the hop headers are dropped. A message too large for the
// queue, or without an event ID on a FIFO queue, fails alone before
// anything is sent; an entry SQS refused as the sender's fault is
// permanent. On a FIFO queue, once a message of a group failed, the later
// messages of that group in the call's later batches are not sent
// (ErrGroupHeld), so that none overtakes it; within one batch SQS decides.
func (s *Sink) Publish(ctx context.Context, msgs ...*ackwise.Message) error {
	if s.closed.Load() {
		return adapters.ErrClosed
	}
	errs := make([]error, len(msgs))
	p := publish{s: s, errs: errs}
	if s.fifo {
		p.failed = map[string]int{}
	}
	for i, m := range msgs {
		e, err := s.entry(i, m)
		if err != nil {
			p.fail(i, aws.ToString(e.e.MessageGroupId), err)
			continue
		}
		if len(p.batch) == maxBatch || len(p.batch) > 0 && p.bytes+e.size > MaxBatchBytes {
			p.send(ctx)
		}
		p.batch = append(p.batch, e)
		p.bytes += e.size
	}
	p.send(ctx)
	return adapters.NewPublishError(errs)
}

// entry builds the batch entry of msgs[i], m (with its FIFO group set, even
// when it returns an error).
func (s *Sink) entry(i int, m *ackwise.Message) (entry, error) {
	id := m.EventID()
	h := make(ackwise.Headers, 0, len(m.Headers)+1)
	if id != "" {
		h = append(h, ackwise.Header{Key: ackwise.HeaderEventID, Value: id})
	}
	for _, kv := range m.Headers {
		if kv.Key != ackwise.HeaderEventID {
			h = append(h, kv)
		}
	}
	body, enc := encodeBody(m.Payload)
	attrs := encodeAttributes(m.Key, h, enc)
	size := messageSize(body, attrs)
	e := entry{i: i, size: size, e: types.SendMessageBatchRequestEntry{
		Id:                aws.String(strconv.Itoa(i)),
		MessageBody:       aws.String(body),
		MessageAttributes: attrs,
	}}
	if s.fifo {
		e.e.MessageGroupId, e.e.MessageDeduplicationId = fifoIDs(m.Key, id)
		if id == "" {
			return e, ackwise.Permanent(ErrNoEventID)
		}
	}
	if size > s.maxSize {
		return e, ackwise.Permanent(fmt.Errorf("%w: %d bytes (body and attributes), %s takes %d", ErrTooLarge, size, s.name, s.maxSize))
	}
	return e, nil
}

// ErrGroupHeld is wrapped by the publish error of a message to a FIFO
// queue not sent because an earlier message of its group in the same
// Publish call failed: sent, it would have overtaken that one.
var ErrGroupHeld = errors.New("sqs: not sent: an earlier message of its FIFO group in this Publish call failed")

// publish is one Publish call under way.
type publish struct {
	s      *Sink
	errs   []error
	batch  []entry
	bytes  int
	failed map[string]int // FIFO: the index of each group's first failed message
}

// fail sets msgs[i]'s error; on a FIFO queue the later messages of its
// group are not sent.
func (p *publish) fail(i int, group string, err error) {
	p.errs[i] = err
	p.failedAt(i, group)
}

// failedAt notes that msgs[i] of group failed, on a FIFO queue.
func (p *publish) failedAt(i int, group string) {
	if first, ok := p.failed[group]; p.failed != nil && (!ok || i < first) {
		p.failed[group] = i
	}
}

// send sends the batch with one call, less the messages of failed FIFO
// groups, and sets the errors of those that failed.
func (p *publish) send(ctx context.Context) {
	s := p.s
	entries := make([]types.SendMessageBatchRequestEntry, 0, len(p.batch))
	byID := make(map[string]int, len(p.batch))
	for _, e := range p.batch {
		group := aws.ToString(e.e.MessageGroupId)
		if first, ok := p.failed[group]; ok && first < e.i {
			p.fail(e.i, group, fmt.Errorf("%w (group %s)", ErrGroupHeld, group))
			continue
		}
		entries = append(entries, e.e)
		byID[aws.ToString(e.e.Id)] = e.i
	}
	p.batch, p.bytes = p.batch[:0], 0
	if len(entries) == 0 {
		return
	}
	out, err := s.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(s.queueURL), Entries: entries})
	if err != nil {
		err = fmt.Errorf("sqs: send to %s: %w", s.name, err)
		for _, e := range entries {
			p.fail(byID[aws.ToString(e.Id)], aws.ToString(e.MessageGroupId), err)
		}
		return
	}
	answered := make(map[int]bool, len(entries))
	for _, ok := range out.Successful {
		if i, found := byID[aws.ToString(ok.Id)]; found {
			answered[i] = true
		}
	}
	for _, f := range out.Failed {
		i, found := byID[aws.ToString(f.Id)]
		if !found {
			continue
		}
		answered[i] = true
		err := fmt.Errorf("sqs: send to %s: refused: %s: %s", s.name, aws.ToString(f.Code), aws.ToString(f.Message))
		if f.SenderFault {
			err = ackwise.Permanent(err)
		}
		p.errs[i] = err
	}
	for _, e := range entries {
		if i := byID[aws.ToString(e.Id)]; !answered[i] {
			p.errs[i] = fmt.Errorf("sqs: send to %s: SendMessageBatch gave no result for the message; it may have been sent", s.name)
		}
	}
	// A group's failed message, then its later ones: held.
	for _, e := range entries {
		if i := byID[aws.ToString(e.Id)]; p.errs[i] != nil {
			p.failedAt(i, aws.ToString(e.MessageGroupId))
		}
	}
}

// Close makes later Publish calls fail with adapters.ErrClosed. Publish
// returns only once SQS answered, so there is nothing to flush.
func (s *Sink) Close() error {
	s.closed.Store(true)
	return nil
}
