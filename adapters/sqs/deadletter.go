package sqs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// DeadLetter sends msg to the dead-letter queue (SendMessage), its body as
// received and its attributes with the envelope added (packed as
// encodeAttributes does within SQS's 10 attributes), then deletes it. On a
// FIFO dead-letter queue the message group is the key (the event ID
// without one) and the deduplication ID the event ID, each as is when SQS
// takes it, else its SHA-256 in hex. A dead letter the envelope takes over
// the dead-letter queue's MaximumMessageSize is written with its payload
// cut, marked with dlq.HeaderTrimmed (value-bytes, value-kept,
// value-sha256): never retried for ever.
//
// With broker-managed dead letters (Config.DeadLetters = DeadLetterBroker)
// it sends nothing: it makes msg visible again at once, and SQS moves it
// to the RedrivePolicy's dead-letter queue, as it holds it and without the
// envelope, on the receive after its maxReceiveCount-th (see handBack).
func (s *Source) DeadLetter(ctx context.Context, msg *ackwise.Message, env dlq.Envelope) error {
	if s.brokerDL {
		return s.handBack(ctx, msg, env)
	}
	if s.dlqURL == "" {
		return fmt.Errorf("sqs: dead-letter message %s: no dead-letter queue (Config.DeadLetterQueueURL, URL parameter dlq): %w", msg.BrokerID, errors.ErrUnsupported)
	}
	r, err := s.begin(msg, "dead-letter")
	if err != nil {
		return err
	}
	headers := env.Apply(msg.Headers)
	body, attrs := r.body, encodeAttributes(msg.Key, headers, r.enc)
	if size := messageSize(body, attrs); size > s.dlqMax {
		body, attrs = trim(decodeBody(r.body, r.enc), msg.Key, headers, size-len(body), s.dlqMax)
		s.log.Warn("sqs: dead letter too large for the dead-letter queue: payload cut", slog.String(ackwise.LogKeySource, s.name), slog.String(ackwise.LogKeyEventID, msg.EventID()), slog.String(ackwise.LogKeyBrokerID, msg.BrokerID), slog.Int("size", size), slog.Int("max", s.dlqMax))
	}
	in := &sqs.SendMessageInput{QueueUrl: aws.String(s.dlqURL), MessageBody: aws.String(body), MessageAttributes: attrs}
	if s.dlqFIFO {
		id := msg.EventID()
		if id == "" {
			id = msg.BrokerID
		}
		in.MessageGroupId, in.MessageDeduplicationId = fifoIDs(msg.Key, id)
	}
	if _, err := s.client.SendMessage(ctx, in); err != nil {
		return r.end(fmt.Errorf("sqs: dead-letter message %s to %s: %w", msg.BrokerID, queueName(s.dlqURL), err))
	}
	return r.end(s.acks.do(ctx, "dead-letter", msg, r, 0))
}

// trim returns the body and attributes of a dead letter of payload, key
// and headers cut to fit limit bytes: the payload's first bytes that fit
// beside the attributes (attrSize of them without the marker) and the
// marker, base64 if need be.
func trim(payload []byte, key string, headers ackwise.Headers, attrSize, limit int) (string, map[string]types.MessageAttributeValue) {
	sum := sha256.Sum256(payload)
	const markerRoom = 160 // the marker's name, type and value
	// Base64 takes 4 bytes for 3: keep what fits encoded.
	keep := min(max(0, (limit-attrSize-markerRoom)/4*3), len(payload))
	if utf8.Valid(payload) {
		for keep > 0 && keep < len(payload) && !utf8.RuneStart(payload[keep]) {
			keep-- // a text payload is cut at a rune boundary, and stays text
		}
	}
	h := headers.Clone()
	h.Set(dlq.HeaderTrimmed, fmt.Sprintf("value-bytes=%d;value-kept=%d;value-sha256=%s", len(payload), keep, hex.EncodeToString(sum[:])))
	body, enc := encodeBody(payload[:keep])
	return body, encodeAttributes(key, h, enc)
}

// fifoIDs returns the MessageGroupId and MessageDeduplicationId of a
// message with key and event ID id to a FIFO queue: the key (id without
// one) and id, each through fifoID.
func fifoIDs(key, id string) (group, dedup *string) {
	if key == "" {
		key = id
	}
	return aws.String(fifoID(key)), aws.String(fifoID(id))
}

// fifoID returns s as a FIFO message group or deduplication ID: as is
// when SQS takes it (1 to 128 of letters, digits and ASCII punctuation),
// else its SHA-256 in hex.
func fifoID(s string) string {
	ok := s != "" && len(s) <= 128
	for i := 0; ok && i < len(s); i++ {
		ok = s[i] > ' ' && s[i] < 0x7f
	}
	if ok {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
