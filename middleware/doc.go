// Package middleware holds ackwise's built-in middleware: [Recover],
// [Timeout], [Logging], [Validate] and [Permanentize], the idempotency
// [Inbox] with its stores (and [BatchInbox], its counterpart for
// [ackwise.BatchHandler]), the [VersionGate], and [IdempotencyKey] for calls
// to external systems. Each is an [ackwise.Middleware] (func(Handler)
// Handler) and is safe for concurrent use.
//
// # Order
//
// The consumer engine composes the built-in pipeline in a fixed order, so
// that retries and dead-lettering cannot be put in the wrong order by
// accident:
//
//	recover → classify → inbox → user middleware → handler
//
// The engine's own recover (not [Recover], which is for pipelines the engine
// does not run) sits outside everything so that a panic anywhere becomes a
// classified error; the inbox sits inside classification so that its
// transaction ends (commit or rollback) before the engine decides to ack,
// retry or dead-letter. Validate, Permanentize, Timeout and Logging are user
// middleware; Validate and Permanentize belong innermost, next to the code
// whose errors they classify.
//
// # Exactly-once effects: the inbox
//
// A broker delivers some messages twice (a consumer crashed after its effect
// and before its ack; a lease ran out; a rebalance replayed a partition).
// [Inbox] makes the second delivery change nothing. It keys each event by
// (consumer name, event ID). The event ID is the producer's stable
// ackwise-event-id header (or what [InboxConfig].KeyFunc returns) — never a
// hash of the payload, because two identical top-ups are two events.
//
// The record commits in the same transaction as the handler's effect:
//
//  1. claim: begin a transaction and insert (consumer, event ID); a
//     concurrent claimer of the same key blocks on the unique index until
//     this transaction ends;
//  2. run the handler with the transaction in its context
//     (pginbox.Tx(ctx), sqliteinbox.Tx(ctx)); it writes its effects through
//     it;
//  3. handler returned nil: commit record and effects together; handler
//     failed or panicked: roll both back, so the retry runs the handler again
//     (a deduplicator that records the key before the handler runs would drop
//     that retry as a duplicate);
//  4. a delivery whose key is already committed is acknowledged without
//     running the handler.
//
// Every crash point is covered: a crash before the commit rolls back effect
// and record together, so the redelivery applies the event once; a crash
// between the commit and the ack leaves the record, so the redelivery is
// acknowledged without a second effect; a commit whose outcome is unknown is
// retried, and the retry finds the record if the commit happened.
//
// Stores: pginbox (PostgreSQL, pgx), sqliteinbox (SQLite, modernc.org/sqlite,
// no cgo; the embedded default for examples and single-node services),
// redisinbox (Redis SET NX with a TTL; not transactional, for guarding
// external calls — see its package documentation for the exact semantics
// and failure windows) and meminbox (memory, for tests). Stacking the inbox
// and the version gate on pginbox or sqliteinbox stores over one database
// pool (one Store, or two with different tables) runs both in one
// transaction.
//
// Effects outside the database transaction — an HTTP call to a payment
// provider, an e-mail — cannot commit with the record. Pass
// [IdempotencyKey](msg, consumer, step) to such APIs: it is the same on every
// redelivery of the event and different for each step and consumer, so the
// provider's own deduplication absorbs the repeat.
//
// # Sizing retention
//
// An inbox record must outlive every redelivery of its event, and every
// deliberate replay you may run:
//
//	retention ≥ longest redelivery window + replay window + safety margin
//
// The longest redelivery window is how long after a first delivery the
// broker can still deliver the same event: the retry policy's total delay
// (all backoffs, or the last tier of a retry-topic chain) plus the
// dead-letter time until a redrive (a dead letter redriven a week later is a
// redelivery of the same event ID), plus the broker's own limits — SQS
// retention up to 14 days, Pub/Sub message retention up to 7 days (31 for a
// topic), Kafka topic retention.ms when a consumer group may be reset to an
// earlier offset, RabbitMQ queue TTLs. The replay window is how far back you
// may rewind a consumer (a Kafka offset reset, a Pub/Sub seek, a redrive of
// an archive). A record pruned too early lets a late redelivery apply twice;
// a record kept too long costs only disk (one small row per event). When in
// doubt, keep records for the broker's maximum retention plus a few days:
// with SQS, 14 days + 3 days. Prune with pginbox.Store.Prune or
// sqliteinbox.Store.Prune from a periodic job (hourly is plenty); Redis
// records expire by their TTL (redisinbox.Config.Retention).
//
// # Ordering: the version gate
//
// [VersionGate] applies an event only if its aggregate version (header
// ackwise-aggregate-version) is newer than the last one applied for that
// aggregate, stored like the inbox and in the same transaction. It is for
// full-state events, where a newer state replaces an older one and an older
// event arriving late can be skipped. Delta events ("add 10") cannot be
// skipped: a skipped delta is a lost change. For them, hold the gap: apply
// version n only after n-1 (fail an early arrival so it is retried), and let
// the inbox make each delta apply once. The version is producer input: a
// version below 1, or one more than [VersionGateConfig].MaxVersionGap above
// the recorded one, is dead-lettered, not recorded (a forged MaxInt64 would
// otherwise hold its aggregate for good).
//
// # Classification helpers
//
// [Validate] runs a check before the handler and [Permanentize] marks
// handler errors: decode and schema errors ([DecodeErrors], [ErrInvalid],
// [MatchAs], [MatchIs]) become [ackwise.Permanent], so they reach the
// dead-letter destination at once instead of spending the retry budget.
// [Recover] turns a panic into a [*PanicError], permanent by default, with a
// bounded stack in its text. [Timeout] gives each call a deadline and marks
// the overrun with [ErrTimeout] (transient). [Logging] writes one slog record
// per call.
//
// # Tracing
//
// [Tracing] starts a consumer span per message, continuing the producer's
// trace from the W3C traceparent header (producer.Publisher injects it), and
// marks failed spans with their error class. Metrics come from
// consumer.NewMetrics, an Observer of the engine; the inbox counts the
// duplicates it absorbed (InboxConfig.MeterProvider).
package middleware
