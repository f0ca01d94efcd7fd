// Package sqs is the ackwise adapter for Amazon SQS, on aws-sdk-go-v2's
// SQS client. Import it for the awssqs:// URL scheme (gocloud.dev's):
//
//	awssqs://sqs.us-east-2.amazonaws.com/123456789012/orders?region=us-east-2&dlq=orders-dlq
//	awssqs://127.0.0.1:9324/000000000000/orders?endpoint=http://127.0.0.1:9324   (an emulator)
//
// The queue URL is https:// with the URL's host and path. Credentials come
// from the AWS SDK's default chain (environment, shared files, SSO, web
// identity, ECS or EC2 roles), or from WithAWSConfig; a URL with user info
// is refused. The adapter never logs credentials nor puts them in an error
// or a dead letter.
//
// # URL parameters
//
// Each for a source, a sink or both; one of the other side is refused, as
// are an unknown, repeated or empty one (errors match adapters.ErrBadURL
// and name the parameter; docs/sqs.md has the same table):
//
//	region        both    AWS region (default: REGION of a host sqs.REGION.amazonaws.com, else the AWS chain's)
//	endpoint      both    SQS endpoint to call instead of AWS's, for emulators
//	dlq           source  dead-letter queue: a name beside the queue, or an https:// queue URL
//	dlq_mode      source  ackwise (default): DeadLetter writes to dlq; broker: the RedrivePolicy moves
//	max_attempts  source  the consumer's retry max attempts (default 5); broker mode checks it
//	wait          source  long-poll wait, whole seconds 1s–20s (default 20s; -1: short polling)
//	visibility    source  visibility timeout each receive asks for, 1s–12h (default: the queue's)
//	ack_linger    source  how long an ack waits to share a DeleteMessageBatch call (default 5ms)
//	pollers       source  ReceiveMessage calls under way at once, 1–64, within the in-flight window (default 2)
//
// Options: WithLogger gives a source's logger, which gets its warnings
// (no dead-letter queue, a RedrivePolicy moving messages before the
// consumer's max attempts, a dead-letter queue keeping messages for less
// time than the queue, a dead letter cut to fit or handed back to SQS; a
// sink logs nothing and refuses it); WithTLSConfig is the TLS configuration of the HTTPS
// connections; WithAWSConfig (this package's) replaces the default chain's
// AWS configuration. WithMeterProvider and WithTracerProvider are refused:
// the adapter has no metrics or spans of its own yet.
//
// # Source
//
// Receive is fed by up to Config.Pollers (pollers=) ReceiveMessage calls
// under way at once: long polling (wait), up to 10 messages each, every
// message attribute and system attribute, and the lease as the visibility
// timeout. Together they ask for no more than the engine's in-flight
// window has room for (the latest Receive's len(buf), less what was handed
// over since, less what was received and not handed over yet), so no
// message waits in the source burning its visibility timeout for want of
// a place. They go on between Receive calls. When the latest Receive's
// context ends (a consumer stopping) no new one starts, and the messages
// received but not handed over, and those the polls under way still
// bring, go back to the queue at once (ChangeMessageVisibilityBatch to 0);
// the polls under way run to their end, since a long poll cancelled may
// leave messages SQS had already handed out invisible until their
// visibility timeout ends. Close cancels them.
// Capabilities:
//   - DeliveryCount: Attempt is ApproximateReceiveCount (bounded by
//     ackwise.MaxAttempt); a producer's ackwise-attempt attribute is not
//     read. On a redelivery, FirstFailure is ApproximateFirstReceiveTimestamp
//     (SQS keeps no failure time; the first attempt began then).
//   - Lease: the visibility timeout (Config.VisibilityTimeout, else the
//     queue's, read when the source opens). The source keeps each
//     delivery's lease on its own clock, from the response, less a tenth of
//     the lease up to 1s: past it Valid is false and a settle returns an
//     error wrapping adapters.ErrReceiptInvalid without calling SQS (which
//     may take an old receipt handle and act on the message's next
//     delivery).
//   - ExtendLease: ChangeMessageVisibilityBatch (shared as acks share
//     deletes) to the lease from now.
//   - Delay, MaxDelay 12h: Nack is ChangeMessageVisibilityBatch to the
//     delay, rounded up to whole seconds. SQS keeps a message invisible at most
//     12 hours from the receive that delivered it: a Nack delay or a lease
//     extension is cut to what is left of that (the message comes back
//     sooner than asked, as its next attempt), and an extension with
//     nothing left fails (the message comes back when its lease ends and
//     the inbox absorbs a second run). On a FIFO queue a message waiting
//     for its retry holds back its message group: SQS hands out no later
//     message of the group while it is invisible, and the consumer's
//     default retry mode (in place, on an ordered source) also holds the
//     group's messages already received; with consumer.RetryBroker those
//     run ahead of it.
//   - Ordered on a FIFO queue (name ending .fifo).
//   - BrokerDeadLetters with broker-managed dead letters (below).
//
// Ack deletes with DeleteMessageBatch: acks within ack_linger share a call,
// up to 10, and each Ack returns once SQS answered for it; an entry SQS
// fails alone fails that Ack alone (an invalid or expired receipt wraps
// adapters.ErrReceiptInvalid). AckBatch (Extensions.BatchAcker) acks many
// the same way. Release is ChangeMessageVisibility 0, alone (the sooner the
// better, and a FIFO lane's releases reach SQS in order). A second settle
// of a delivery fails without calling SQS; after Close every settle fails
// (adapters.ErrClosed and adapters.ErrReceiptInvalid), Valid is false (the
// Invalidator is called) and the deliveries come back when their lease
// ends.
//
// DeadLetter (ackwise-managed dead letters, with dlq=) sends the message to
// the dead-letter queue with SendMessage: the body as received (byte for
// byte), the original attributes and the dlq envelope, packed within SQS's
// 10 attributes as the sink packs headers; then it deletes the original
// (invariant 3; a crash in between writes the dead letter again with the
// same event ID). On a FIFO dead-letter queue the group is the key (the
// event ID without one) and the deduplication ID the event ID. A dead
// letter the envelope takes over the dead-letter queue's
// MaximumMessageSize (read when the source opens) is written with its
// payload cut to fit (at a rune boundary for text) and marked with
// dlq.HeaderTrimmed (value-bytes, value-kept, value-sha256); one whose
// attributes alone do not fit fails, and the message comes back. Without a
// dead-letter queue DeadLetter fails with an error wrapping
// errors.ErrUnsupported and the message comes back after its lease.
//
// Broker-managed dead letters (dlq_mode=broker, Config.DeadLetters =
// DeadLetterBroker) leave the move to the queue's RedrivePolicy. NewSource
// reads it and refuses a queue without one, or whose maxReceiveCount is
// not Config.MaxAttempts (the consumer's retry.Policy.MaxAttempts, 0
// meaning 5 in both), naming both numbers. DeadLetter then writes nothing:
// it makes the message visible at once (ChangeMessageVisibilityBatch to
// 0) and logs its reason, error and message ID, and SQS moves it as it
// holds it, without the envelope, on the receive after its
// maxReceiveCount-th; a permanent failure before that limit is handled
// again until then. In either mode NewSource warns when the dead-letter
// queue's MessageRetentionPeriod is shorter than the queue's: a standard
// queue's dead letters that SQS moves keep their first enqueue time.
//
// MoveTask moves the messages of a dead-letter queue back (or to another
// queue of its type) with SQS's own move task (StartMessageMoveTask) at a
// capped rate, following its progress (ListMessageMoveTasks) and
// cancelling it when its ctx ends; SQS moves messages as they are.
//
// Source.Backlog (dlq.Backlogger) is what dlq.Redrive and the ackwise CLI's
// dlq stats read as the queue's depth: GetQueueAttributes'
// ApproximateNumberOfMessages plus ApproximateNumberOfMessagesNotVisible
// plus ApproximateNumberOfMessagesDelayed, every message the queue holds
// (a dead-letter queue whose messages are in flight does not read as
// empty). SQS's counts are approximate; a queue that does not exist is an
// error, never 0.
//
// The Source is no dlq.Ager: the age of a queue's oldest message,
// ApproximateAgeOfOldestMessage, is a CloudWatch metric, not a queue
// attribute GetQueueAttributes returns, and a receive to look at messages
// hides them from consumers for the visibility timeout and counts toward
// their ApproximateReceiveCount (which a redrive policy on the dead-letter
// queue itself counts). Alert on that CloudWatch metric; the ackwise CLI's
// dlq stats prints the age of the oldest dead letter of its sample.
//
// # Sink
//
// Publish sends with SendMessageBatch, up to 10 messages and MaxBatchBytes
// a call, in order, and reports per message (*adapters.PublishError): an
// entry SQS refused as the sender's fault is permanent; a message larger
// than the queue's MaximumMessageSize (read when the sink opens) fails
// alone before anything is sent (ErrTooLarge). On a FIFO queue the
// MessageGroupId is the key (the event ID without one) and the
// MessageDeduplicationId the event ID — never a hash of the content, so two
// equal bodies with different event IDs both go through; each is used as
// is when SQS takes it (1 to 128 printable ASCII characters), else its
// SHA-256 in hex; a message without an event ID fails (ErrNoEventID).
// Once a message of a FIFO group failed, the group's later messages in the
// call's later batches are not sent (ErrGroupHeld), so none overtakes it.
//
// # Headers and message attributes
//
// Each header is a message attribute: String when its value is text SQS
// takes (valid UTF-8 without control characters but tab, newline and
// carriage return, nor U+FFFE, U+FFFF), else Binary (its bytes).
// Message.Key travels as ackwise-key, the event ID as ackwise-event-id; the
// engine's hop headers (ackwise-attempt, ackwise-first-failure) are
// dropped. SQS takes at most 10 attributes a message: when there are more,
// or some cannot be attributes (a name SQS refuses, an empty value, a
// repeated name), ackwise-key, ackwise-body-encoding, ackwise-event-id,
// traceparent and then the others in order take 9 and the rest go, in
// order, into one String attribute ackwise-headers holding JSON
// (AttrHeaders; docs/headers.md). A payload that is not text SQS takes is
// sent base64-encoded with ackwise-body-encoding=base64, an empty one as
// a single space with ackwise-body-encoding=empty (SQS refuses an empty
// body). On receipt the attributes come back as headers sorted by name,
// then the packed ones in their order: the order of a message's headers
// is not kept. A String or Number attribute is its string, a Binary one
// its bytes.
package sqs
