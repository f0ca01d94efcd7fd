package kafka

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
