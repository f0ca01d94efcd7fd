// Package consumer is the ackwise engine. It pulls messages from an
// [adapters.Source], runs the application's handler on them with bounded
// concurrency and per-key order, and settles each message according to what
// the handler returned:
//
//   - nil: acknowledge (invariant 1: never before the handler returned);
//   - a transient or rate-limited error: redeliver later with backoff and
//     jitter — through the broker's delay mechanism when the adapter was
//     given delay tiers (retry topics, wait queues) or per-key order does not
//     need holding, else in place with a timer that holds only the key —
//     until the retry policy's attempts run out, then dead-letter with reason
//     max-attempts;
//   - a permanent error (or a panic, by default): dead-letter at once;
//   - a discard error: acknowledge and count.
//
// [NewBatch] runs an [ackwise.BatchHandler] on batches instead (bulk writes
// to a database or warehouse): each message of a batch has its own outcome
// and is settled as above, one message per key per batch keeps per-key
// order, and a batch that fails as a whole runs again one message at a time
// so that a poison message is dead-lettered alone (docs/batch.md).
//
// A dead letter is confirmed by the broker before the message is
// acknowledged at its source (invariant 3). In-flight messages never exceed
// Config.MaxInFlight (invariant 6). On shutdown the engine stops receiving,
// lets running handlers finish up to Config.DrainTimeout, settles what
// finished and hands everything else back to the broker unacknowledged
// (invariant 7).
//
// Per-key order (Config.Ordering), Concurrency and MaxInFlight hold
// however fast the handlers are. Fast handlers' messages are acknowledged
// in batches: a message may wait for up to 7 fast messages run after it
// before it is acknowledged and its key and in-flight place are freed. A
// message that goes back to the broker unsettled (its ack failed, it was
// released) takes the messages waiting behind it on its key back with it,
// unrun, so that they do not overtake its redelivery. A move (Nack,
// DeadLetter) that fails while the message is still this consumer's is
// tried again in place, its handler not run again; the redelivery of a
// message whose settle failed otherwise is held in place before it runs.
// Both back off 10ms doubling up to 5s, the message in flight, its key
// held and its lease extended. A message waiting in place or held by the
// open breaker that stops being Valid is handed back at once when the
// source says so (adapters.Invalidator). docs/ordering.md tells how each
// of these works and what it costs.
//
// The handler pipeline has a fixed order owned by the engine: recover →
// classify → inbox (Config.Inbox) → user middleware (Config.Middleware) →
// handler, so retries and dead-lettering can never be put in the wrong order
// by accident.
//
// A service with several consumers runs them with a [Runner]: one
// lifecycle (start together; SIGINT, SIGTERM or the context drains them
// all, within a deadline; the first to stop on its own stops the others)
// and liveness and readiness probes as an http.Handler (/healthz,
// /readyz), which serves the application's metrics exporter at /metrics
// when RunnerConfig.Metrics is set.
//
// [NewMetrics] returns the Observer that records the outcomes with
// OpenTelemetry and, given as Config.Observer itself, the consumer's gauges
// while Run runs: the lag (the age of the oldest message in flight, from
// its broker timestamp), in flight, waiting in place, the breaker's state,
// trips and held messages, and with [WithBacklog] the broker's backlog and
// the estimated time to drain it ([EstimateDrain]).
// docs/observability.md lists every instrument.
package consumer
