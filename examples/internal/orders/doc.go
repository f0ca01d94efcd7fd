// Package orders is the work the worker examples (examples/rabbitmq-worker,
// examples/kafka-worker) do, whatever the broker: an order message, the
// handler that ships it through the idempotency inbox on PostgreSQL or
// SQLite, the demo orders that fail on purpose, and a tally of what became
// of them.
//
// It is internal to the examples: a team copying an example copies this
// package with it, and replaces Order and Store.ship with its own work.
package orders
