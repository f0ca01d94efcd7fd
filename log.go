package ackwise

// Attribute keys of the log records ackwise writes: the engine (package
// consumer), the middleware, the dead-letter tools and the adapters. Each
// key has one meaning wherever it appears, so a log pipeline can pick a
// message's records out by LogKeyEventID across every component. Every
// duration is a slog.Duration value, never a string or a number of
// seconds. Payloads are never logged.
const (
	// LogKeyConsumer is the consumer's name (consumer.Config.Name), on
	// every record of the engine.
	LogKeyConsumer = "consumer"
	// LogKeySource is the topic, queue or subscription a message came
	// from (Message.Source).
	LogKeySource = "source"
	// LogKeyEventID is a message's event ID: its ackwise-event-id header,
	// else Message.ID.
	LogKeyEventID = "event_id"
	// LogKeyBrokerID is the broker's own ID of a message
	// (Message.BrokerID).
	LogKeyBrokerID = "broker_id"
	// LogKeyKey is a message's ordering key (Message.Key).
	LogKeyKey = "key"
	// LogKeyAttempt is a message's delivery attempt, 1 for the first
	// (Message.Attempt). On a dead letter it is the attempt that gave up:
	// the deliveries made.
	LogKeyAttempt = "attempt"
	// LogKeyOutcome is what the engine did, or tried to do, with a message
	// (consumer.Outcome: "acked", "retried", "dead-lettered"...).
	LogKeyOutcome = "outcome"
	// LogKeyReason says why: a dead letter's reason (dlq.Reason), or the
	// reason the broker or a check gave.
	LogKeyReason = "reason"
	// LogKeyClass is a failure's class (ackwise.Class: "transient",
	// "permanent"...).
	LogKeyClass = "class"
	// LogKeyError is the error.
	LogKeyError = "error"
	// LogKeyBatch is the number of messages of a batch handler's batch.
	LogKeyBatch = "batch"
	// LogKeyPanic is the value a handler panicked with.
	LogKeyPanic = "panic"
	// LogKeyDuration is how long the thing the record is about took, or
	// has lasted so far: a handler call, a delivery held.
	LogKeyDuration = "duration"
	// LogKeyDelay is how long a message waits before its next attempt.
	LogKeyDelay = "delay"
	// LogKeyRetryIn is how long until a failed call (a receive, a settle,
	// a reconnection) is tried again.
	LogKeyRetryIn = "retry_in"
	// LogKeyTries is how many tries in a row of a call have failed.
	LogKeyTries = "tries"
	// LogKeyTimeout is the time limit the record is about (a drain
	// deadline, a revoke or transaction timeout, a broker's consumer
	// timeout).
	LogKeyTimeout = "timeout"
	// LogKeyLease is a lease's length: how long a delivery stays this
	// consumer's without an extension.
	LogKeyLease = "lease"
	// LogKeyHeld is how many messages the open breaker holds.
	LogKeyHeld = "held"
	// LogKeyThreshold is the number of keys failing in a row that opens
	// the breaker.
	LogKeyThreshold = "threshold"
	// LogKeyTopic is a topic's name.
	LogKeyTopic = "topic"
	// LogKeyPartition is a partition's number.
	LogKeyPartition = "partition"
	// LogKeyGroup is a consumer group's name.
	LogKeyGroup = "group"
	// LogKeyQueue is a queue's name.
	LogKeyQueue = "queue"
	// LogKeyAggregate is an event's aggregate ID.
	LogKeyAggregate = "aggregate"
	// LogKeyVersion is an event's version (the ackwise-event-version or
	// ackwise-aggregate-version header).
	LogKeyVersion = "version"
	// LogKeyAction is what a dead-letter redrive did with a dead letter
	// (dlq.Action).
	LogKeyAction = "action"
)
