// Package dlq defines the dead-letter envelope: the context that travels with
// a message the engine gave up on, so that a person can see why it failed and
// redrive it once the cause is fixed.
//
// The envelope is encoded as headers added next to the message's own; the
// payload is never touched and the original headers are kept (invariant 4).
// docs/headers.md lists every header.
//
// [Inspect] reads dead letters without consuming them; [Redrive] moves them
// back to a work queue or topic with a rate cap, publishing each one (with
// its event ID unchanged, so idempotent consumers absorb repeats) before it
// acknowledges the dead letter. Redrive counts the redrives of each message
// (header ackwise-redrive-count) and never sends the same dead letters round
// for ever, also into a consumer that still fails them. The ackwise CLI (cmd/ackwise) wraps both;
// docs/redrive.md says how to redrive safely.
//
// [NewDepthMetrics] observes a dead-letter destination's depth (its
// [Backlogger], asked at most once per interval) and, with an [Ager], the
// age of its oldest dead letter, as OpenTelemetry gauges.
package dlq
