// Command ackwise is the operator CLI for ackwise consumers: their dead
// letters and their lag.
//
//	ackwise dlq ls      <source-url> [-n 100] [--json] [--idle 2s]
//	ackwise dlq show    <source-url> <event-id|offset> [--payload] [-n 1000] [--json]
//	ackwise dlq inspect <source-url> [-n 20] [--json] [--idle 2s]
//	ackwise dlq stats   <source-url> [-n 1000] [--json] [--idle 2s]
//	ackwise dlq redrive <dlq-source-url> <target-url> [--rate 10] [--sample K | --max N]
//	                    [--dry-run] [--reason permanent,...] [--class transient,...]
//	                    [--max-age D] [--yes] [--idle 2s] [--max-held 10000]
//	                    [--publish-timeout 30s] [--max-redrives 3] [--force] [-v]
//	                    [--progress-every 5s]
//	ackwise dlq redrive <awssqs-dlq-url> <awssqs-target-url> --native [--rate 10] [--yes]
//	ackwise lag <source-url> [--window 10s] [--json]
//	ackwise version
//	ackwise completion bash|zsh|fish|powershell
//
// The command line is parsed by github.com/spf13/cobra, chosen because it is
// the most widely used Go CLI library (kubectl, gh, hugo) and gives
// subcommands, generated help and shell completion without code of ours;
// the single-dash long flags of earlier releases (-idle 2s) are still read.
// Redrive's progress bar is github.com/schollz/progressbar/v3.
//
// URLs are opened with adapters.OpenSource and adapters.OpenSink; the
// command registers the kafka, amqp/amqps/rabbit, awssqs and gcppubsub
// schemes (see each adapter's package documentation for its URL
// parameters). It refuses "mem://": that is the in-process broker of one
// command run, which starts empty. A RabbitMQ dead-letter queue is read with
// ?plain=true (a plain source consumes the queue as it is, with no topology
// around it); RabbitMQ URLs work as redrive targets too. An SQS dead-letter
// queue is read with its own awssqs:// URL and a long-poll wait below --idle
// (&wait=1s), the work queue's URL being the redrive target. A Pub/Sub
// dead-letter topic is read through its subscription's gcppubsub:// URL
// (without dead_letter_topic=), a topic's URL being the redrive target. A
// redrive target may be a consumer's own source URL: the parameters only a
// source takes are dropped (adapters.SinkURL), with a note on stderr.
//
// stats prints the dead-letter destination's depth by the broker's own
// count (dlq.Backlogger: RabbitMQ's queue message count, Kafka's end
// offsets less the group's commits, SQS's messages available, in flight
// and delayed; Pub/Sub has no count in its data plane, and the depth is
// printed as unknown, never 0), then counts by reason, error class and source, distinct
// event IDs and their copies over a sample of up to -n messages whose
// size it states; a sample the broker cut short (RabbitMQ's prefetch) says
// so. The oldest dead letter's age is the broker's where the source tells
// it (dlq.Ager: Kafka, the oldest record the group has not read, printed
// "oldest age: … (the broker's …)", JSON broker_oldest_age_seconds), else
// the sample's (RabbitMQ, SQS and Pub/Sub: their data planes cannot tell
// it without taking a message; see docs/redrive.md). A queue or topic that does not
// exist is an error (exit status 1), never an empty destination.
//
// ls, show, inspect and stats receive dead letters and release every one of
// them before they exit: they never consume. redrive moves dead letters
// back, publishing each (payload, key, event ID and original headers
// unchanged, envelope removed) and acknowledging it at the dead-letter
// source only once the publish is confirmed; see dlq.Redrive and
// docs/redrive.md. Redrive only into consumers that deduplicate on the
// event ID. A real redrive asks for confirmation on the terminal unless
// --yes, and refuses to run without --yes when stdin is not a terminal; it
// shows a progress bar when stderr is a terminal and prints a progress line
// every --progress-every otherwise. A redrive always ends, also into a
// consumer that still fails: it counts the redrives of each dead letter
// (header ackwise-redrive-count) and leaves, and reports, one redriven
// --max-redrives times already unless --force; it moves an event at most
// once per run; and it receives no more messages than the dead-letter
// destination held when it started, where the broker can tell.
//
// redrive --native (awssqs:// URLs only) lets SQS move the messages
// instead, with its own move task (sqs.MoveTask: StartMessageMoveTask at
// --rate, 1 to 500 a second, -1 for SQS's choice), printing its progress:
// every message moves as it is, with no filter, count or envelope removal,
// and it takes no other flag but --rate and --yes. It is the way to redrive dead
// letters SQS moved itself (the adapter's dlq_mode=broker), which carry no
// envelope.
//
// lag samples a consumer's backlog twice, --window apart, without
// consuming or joining its group (kafka.GroupOffsets, rabbitmq.QueueDepth,
// else dlq.Backlogger), and prints the ingress and consume rates (Kafka) or
// the net drain rate (queues) and the estimated time to drain: backlog ÷
// (consume rate − ingress rate), "never" when consumers do not keep up.
//
// Payloads are printed only by show --payload (they may hold personal
// data); passwords in URLs and the values of credential headers are never
// printed.
//
// Exit status: 0 on success, 1 on a runtime error (a broker that cannot be
// reached, a failed publish, a dead letter show did not find), 2 on a usage
// error.
package main
