package consumer_test

import (
	"context"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
)

// Regression (fixed): validate checks MaxInFlight against the raw Concurrency, before
// defaults (config.go:179); MaxInFlight 2 with the default Concurrency 4 is
// accepted although the doc says MaxInFlight must be at least Concurrency.
func TestRegressionMaxInFlightBelowDefaultConcurrency(t *testing.T) {
	t.Parallel()
	src := newFakeSource(adapters.Capabilities{})
	h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil })
	if _, err := consumer.New(src, h, consumer.Config{MaxInFlight: 2}); err == nil {
		t.Fatal("MaxInFlight 2 below the default Concurrency 4 accepted")
	}
}
