// Package ackwise is the shared vocabulary of the ackwise SDK: the [Message]
// an adapter delivers, the [Handler] application code implements, [Middleware]
// and [Chain] to compose handlers, the error classes that steer retries
// ([Permanent], [RetryAfter], [Discard], [ClassOf]) and the canonical header
// names every adapter reads and writes.
//
// ackwise turns a broker's at-least-once delivery into exactly-once effects:
// a message is acknowledged only after its handler returned nil, failures are
// classified and retried with backoff, in place or through the broker's own
// delay mechanism, and messages that cannot succeed go to a dead-letter
// destination with the context needed to fix and redrive them.
//
// The engine lives in package consumer, broker adapters under adapters/, and
// the in-memory broker used for tests in adapters/memory.
package ackwise
