// Command ackwise is the operator CLI for ackwise dead letters.
//
//	ackwise dlq inspect <source-url> [-n 20] [-json] [-idle 2s]
//	ackwise dlq stats   <source-url> [-n 1000] [-json] [-idle 2s]
//	ackwise dlq redrive <dlq-source-url> <target-sink-url> [-rate 10] [-max N]
//	                    [-dry-run] [-reason permanent,...] [-class transient,...]
//	                    [-idle 2s] [-max-held 10000] [-publish-timeout 30s]
//	                    [-max-redrives 3] [-force] [-v]
//	ackwise dlq redrive <awssqs-dlq-url> <awssqs-target-url> -native [-rate 10]
//
// URLs are opened with adapters.OpenSource and adapters.OpenSink; the
// command registers the mem, kafka, amqp/amqps/rabbit, awssqs and gcppubsub schemes
// (see each adapter's package documentation for its URL parameters). A
// "mem://" URL opens the in-process broker of this one command run, so it
// is useful only in tests. A RabbitMQ dead-letter queue is read with
// ?plain=true (a plain source consumes the queue as it is, with no topology
// around it); RabbitMQ URLs work as redrive targets too. An SQS dead-letter
// queue is read with its own awssqs:// URL and a long-poll wait below -idle
// (&wait=1s), the work queue's URL being the redrive target. A Pub/Sub
// dead-letter topic is read through its subscription's gcppubsub:// URL
// (without dead_letter_topic=), a topic's URL being the redrive target.
//
// stats prints the dead-letter destination's depth by the broker's own
// count (dlq.Backlogger: RabbitMQ's queue message count, Kafka's end
// offsets less the group's commits, SQS's messages available, in flight
// and delayed; Pub/Sub has no count in its data plane, and the depth is
// printed as unknown, never 0), then counts by reason, error class and source, distinct
// event IDs and their copies, and the oldest dead letter's age over a
// sample of up to -n messages whose size it states; a sample the broker
// cut short (RabbitMQ's prefetch) says so. A queue or topic that does not
// exist is an error (exit status 1), never an empty destination.
//
// inspect and stats receive dead letters and release every one of them
// before they exit: they never consume. redrive moves dead letters back,
// publishing each (payload, key, event ID and original headers unchanged,
// envelope removed) and acknowledging it at the dead-letter source only once
// the publish is confirmed; see dlq.Redrive and docs/redrive.md. Redrive only
// into consumers that deduplicate on the event ID. A redrive always ends,
// also into a consumer that still fails: it counts the redrives of each
// dead letter (header ackwise-redrive-count) and leaves, and reports, one
// redriven -max-redrives times already unless -force; it moves an event at
// most once per run; and it receives no more messages than the dead-letter
// destination held when it started, where the broker can tell.
//
// redrive -native (awssqs:// URLs only) lets SQS move the messages instead,
// with its own move task (sqs.MoveTask: StartMessageMoveTask at -rate, 1 to
// 500 a second, -1 for SQS's choice), printing its progress: every message
// moves as it is, with no filter, count or envelope removal, and it takes
// no other flag. It is the way to redrive dead letters SQS moved itself
// (the adapter's dlq_mode=broker), which carry no envelope.
//
// Payloads are never printed (they may hold personal data); passwords in URLs
// are never printed.
//
// Exit status: 0 on success, 1 on a runtime error (a broker that cannot be
// reached, a failed publish), 2 on a usage error.
package main
