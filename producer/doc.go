// Package producer publishes events with stable IDs and broker confirmation.
//
// A [Publisher] wraps an [adapters.Sink]. It gives every message without an
// ID (neither Message.ID nor the ackwise-event-id header; an ID only in the
// header becomes Message.ID) a new event ID (a UUIDv7: unique, and ordered by time, which keeps inbox
// indexes compact) before the first attempt, so that a publish retried after
// a lost confirmation carries the same ID and the consumer's inbox absorbs the
// copy. It returns only after the broker confirmed every message, retrying
// transient failures with the retry policy's backoff. When the sink reports
// which messages failed (adapters.PublishError), only those are retried,
// and the error lists, by the caller's indexes, only the messages that
// failed in the end. A failure marked ackwise.Permanent is not retried; one
// marked ackwise.RetryAfter waits at least the delay it asks for, or is
// returned at once when that delay is longer than the policy's MaxInterval.
//
// InjectTrace writes the W3C trace context of the current span into a
// message's headers; Publish does it for every message that has no
// traceparent yet (a forwarded message keeps the trace it started in), so
// consumers using middleware.Tracing continue the producer's trace.
//
// With Config.TracerProvider each Publish call is a producer span
// ("publish <destination>", the OpenTelemetry messaging conventions), and
// the traceparent written is that span's; with Config.MeterProvider the
// messages confirmed and failed (by error class) and the call's duration
// are recorded (MetricPublished, MetricFailed, MetricPublishDuration).
//
// The transactional outbox, for publishing as part of a database write,
// lives in producer/outbox (docs/outbox.md).
package producer
