package kafka

import (
	"context"
	"testing"

	"github.com/ackwise/ackwise"
)

// NewTopicName returns a fresh topic name (for the external test package).
func NewTopicName(testing.TB) string { return uniq("conf") }

// ReadTopicForTest reads a topic up to its end as messages.
func ReadTopicForTest(ctx context.Context, t testing.TB, brokers []string, topic string) []*ackwise.Message {
	recs := readAll(ctx, t, brokers, topic)
	out := make([]*ackwise.Message, len(recs))
	for i, r := range recs {
		out[i] = recordMessage(r)
	}
	return out
}
