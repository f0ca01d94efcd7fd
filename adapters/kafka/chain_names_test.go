package kafka

import (
	"strings"
	"testing"
	"time"
)

// TestChainNamesCollideOnlyInDotUnderscore: Kafka refuses a topic whose name
// differs from an existing one only in '.' against '_' (their metric names
// collide), so such a chain cannot be created; validation says so up front.
func TestChainNamesCollideOnlyInDotUnderscore(t *testing.T) {
	cfg := SourceConfig{ClientConfig: ClientConfig{Brokers: []string{"h:9092"}}, Topic: "orders", Group: "g", DeadLetterTopic: "orders_retry_1m", RetryTiers: []time.Duration{time.Minute}}
	err := cfg.withDefaults().validate()
	if err == nil || !strings.Contains(err.Error(), "orders.retry.1m") {
		t.Fatalf("validate = %v, want an error naming orders.retry.1m", err)
	}
}

func TestChainNamesDLQCollidesWithTopicInDotUnderscore(t *testing.T) {
	cfg := SourceConfig{ClientConfig: ClientConfig{Brokers: []string{"h:9092"}}, Topic: "orders.dlq", Group: "g", DeadLetterTopic: "orders_dlq"}
	if err := cfg.withDefaults().validate(); err == nil || !strings.Contains(err.Error(), "DeadLetterTopic") {
		t.Fatalf("validate = %v, want an error naming DeadLetterTopic", err)
	}
}
