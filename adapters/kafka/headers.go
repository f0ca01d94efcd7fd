package kafka

import "github.com/ackwise/ackwise/dlq"

// Headers of a retry-topic hop, besides ackwise-attempt and
// ackwise-first-failure. The source consumes them: a message delivered from
// a retry topic does not show them in Message.Headers.
const (
	// HeaderRetryDue is when a record on a retry topic is due, as Unix
	// milliseconds.
	HeaderRetryDue = "ackwise-retry-due"
	// HeaderOriginalTopic is the topic a retried record was first read from.
	HeaderOriginalTopic = "ackwise-original-topic"
	// HeaderOriginalPartition is the partition a retried record first sat in.
	HeaderOriginalPartition = "ackwise-original-partition"
	// HeaderOriginalOffset is the offset a retried record first had.
	HeaderOriginalOffset = "ackwise-original-offset"
	// HeaderRetryGroup is the consumer group that moved a record to a retry
	// topic. A source settles, without delivering, the records of a retry
	// topic that another group moved there (groups sharing retry topics).
	HeaderRetryGroup = "ackwise-retry-group"
)

// HeaderDLQTrimmed marks a dead letter written trimmed because it did not
// fit the dead-letter topic's max.message.bytes whole (see docs/kafka.md):
// "value-bytes=N;value-kept=M;value-sha256=HEX;headers-dropped=H;
// key-bytes-dropped=K;event-id-bytes-dropped=E", where N and HEX are the
// size and SHA-256 of the whole value, M the bytes of it kept (its first
// M), H the number of original headers left out, K and E the bytes of the
// key and event ID left out (0: kept). A dead letter that fit carries no
// such header.
const HeaderDLQTrimmed = dlq.HeaderTrimmed
