package middleware

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ackwise/ackwise/internal/scope"
)

// MeterName is the instrumentation scope name of the meter the middleware
// use (InboxConfig.MeterProvider). Its version is ackwise's module version.
const MeterName = "github.com/ackwise/ackwise/middleware"

// MetricInboxDuplicates counts the messages [Inbox] (or [BatchInbox])
// acknowledged without running the handler, their event already handled
// ({message}), with the
// attributes ackwise.consumer.name (InboxConfig.Consumer) and
// messaging.destination.name (Message.Source): the duplicates that
// at-least-once delivery produced and the inbox absorbed.
const MetricInboxDuplicates = "ackwise.consumer.inbox.duplicates"

// Metric attribute keys, the same as the consumer's metrics.
const (
	AttrConsumer    = "ackwise.consumer.name"
	AttrDestination = "messaging.destination.name"
)

// duplicateCounter counts the duplicates of one Inbox; the zero value
// counts nothing.
type duplicateCounter struct {
	c        metric.Int64Counter
	consumer attribute.KeyValue
}

func newDuplicateCounter(mp metric.MeterProvider, consumer string) (duplicateCounter, error) {
	if mp == nil {
		return duplicateCounter{}, nil
	}
	c, err := mp.Meter(MeterName, metric.WithInstrumentationVersion(scope.Version())).Int64Counter(MetricInboxDuplicates,
		metric.WithUnit("{message}"),
		metric.WithDescription("Messages acknowledged without running the handler: their event was handled already."))
	if err != nil {
		return duplicateCounter{}, fmt.Errorf("middleware: creating %s: %w", MetricInboxDuplicates, err)
	}
	return duplicateCounter{c: c, consumer: attribute.String(AttrConsumer, consumer)}, nil
}

// add counts one duplicate from source. It builds the attribute set per
// call: duplicates are the exception, and sources are not known ahead.
func (d duplicateCounter) add(ctx context.Context, source string) {
	if d.c == nil {
		return
	}
	d.c.Add(ctx, 1, metric.WithAttributes(d.consumer, attribute.String(AttrDestination, source)))
}
