// Package consumer is the ackwise engine. It pulls messages from an
// [adapters.Source], runs the application's handler on them with bounded
// concurrency and per-key order, and settles each message according to what
// the handler returned:
//
//   - nil: acknowledge (invariant 1: never before the handler returned);
//   - a transient or rate-limited error: redeliver later with backoff and
//     jitter — through the broker's delay mechanism when per-key order does
//     not need holding, else in place with a timer that holds only the key —
//     until the retry policy's attempts run out, then dead-letter with reason
//     max-attempts;
//   - a permanent error (or a panic, by default): dead-letter at once;
//   - a discard error: acknowledge and count.
//
// A dead letter is confirmed by the broker before the message is
// acknowledged at its source (invariant 3). In-flight messages never exceed
// Config.MaxInFlight (invariant 6). On shutdown the engine stops receiving,
// lets running handlers finish up to Config.DrainTimeout, settles what
// finished and hands everything else back to the broker unacknowledged
// (invariant 7).
//
// The engine measures how long messages take to run and hands them out
// accordingly. Slow handlers (above about 20µs a message) get one message
// at a time from a shared queue, so an idle worker always takes the next
// one, and each message is acknowledged as soon as its handler returned.
// Fast handlers get the ready messages in batches, one per worker, and a
// worker acknowledges and finishes the messages of its batch together, at
// least every 8 messages: a message may wait for up to 7 fast messages run
// after it before it is acknowledged and its key and in-flight place are
// freed. Handlers cheaper than a hand-off (below about 0.5µs a message) run
// on the receiving goroutine itself. A message that blocks in a batch holds back
// the rest of its batch, and the messages that finished before it, for a few
// milliseconds at most: a stall watch (every 2ms) then acknowledges and
// finishes those, hands the rest to the other workers and falls back to one
// message at a time. Per-key order, Concurrency and MaxInFlight hold in
// every mode. A message that goes back to the broker unsettled (its settle
// failed, or it was released) takes the messages waiting behind it in its
// lane back with it, unrun, so that they do not overtake its redelivery
// (docs/ordering.md). A move (Nack to a retry topic or wait queue,
// DeadLetter) that fails while the message is still this consumer's is
// tried again in place, 10ms doubling up to 5s, the message in flight, its
// lane held and its lease extended, its handler not run again. A message
// whose settle failed otherwise (its ack, or a move that took its receipt
// with it) comes back at once; the engine remembers it by Source and
// BrokerID and holds each redelivery in place (in flight, its lane held,
// its lease extended, at the same attempt), 10ms doubling per failure in a
// row up to 5s, so that the redeliveries do not spin. The other messages
// are not held back. A message without a broker ID (an AMQP message
// published without a message-id) is recognised by its Source, Key, ID and
// Payload as received (what the handler changes in the message does not
// count); two such messages alike in all four count as one. A message
// waiting in place (a failed move, a held redelivery, a retry in place) or
// held by the open breaker that stops being Valid is handed back at once
// when the source says so (adapters.Invalidator: a Kafka revoke, a dead
// RabbitMQ channel, a memory log partition that changes hands), else when
// its wait ends or the probe reaches it; a breaker left holding nothing
// closes.
//
// The handler pipeline has a fixed order owned by the engine: recover →
// classify → inbox (Config.Inbox) → user middleware (Config.Middleware) →
// handler, so retries and dead-lettering can never be put in the wrong order
// by accident.
package consumer
