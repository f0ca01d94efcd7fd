// Package gcppubsub is the ackwise adapter for Google Cloud Pub/Sub, on
// cloud.google.com/go/pubsub/v2. A [Source] receives from one subscription
// through the client's streaming pull; a [Sink] publishes to one topic and
// awaits every result. Both implement the contract of package adapters, and
// the package registers the URL scheme gcppubsub with [adapters.Register],
// in gocloud.dev's form:
//
//	gcppubsub://projects/<project>/subscriptions/<subscription>[?dead_letter_topic=<topic>]   (source)
//	gcppubsub://projects/<project>/topics/<topic>                                           (sink)
//
// The parameters, each for a source, a sink or both; one the other side
// uses is an error naming it, and so is an unknown, repeated or empty one,
// a bad value and a malformed query (errors match adapters.ErrBadURL):
//
//	parameter          type                    side    meaning
//	endpoint           host:port               both    Pub/Sub API endpoint (a regional one), TLS and default credentials
//	emulator           host:port               both    an emulator: plaintext, no credentials, as PUBSUB_EMULATOR_HOST
//	dead_letter_topic  string                  source  ackwise-managed dead letters to this topic (an ID, or projects/P/topics/T); default none: broker-managed
//	max_attempts       int ≥ 1, or -1          source  the consumer's max attempts, checked against the dead-letter policy (default 5; -1 unlimited)
//	handler_timeout    duration                source  the consumer's handler timeout, which max_extension must cover (default none)
//	max_outstanding    int ≥ 1                 source  flow control: most messages received and not settled (default 100)
//	streams            int in [1, 64]          source  streaming-pull streams (default 1)
//	ack_deadline       duration in [10s,600s]  source  ack deadline asked per extension (default: the client's, 60s at first)
//	max_extension      duration                source  longest the client extends a delivery (default 60m, or what handler_timeout needs)
//
// # Credentials and endpoints
//
// Credentials come from the default chain (Application Default
// Credentials), or from client options given with [WithClientOptions]; a
// URL with user info is refused, and neither the URL nor an error carries
// credentials. The client honours PUBSUB_EMULATOR_HOST itself (plaintext,
// no credentials); emulator= does the same for one source or sink, and
// endpoint= is refused beside either.
//
// Options of adapters.OpenSource and adapters.OpenSink: adapters.WithLogger
// is Config.Logger / SinkConfig.Logger (warnings: a delivery held past
// max_extension, a failed exactly-once ack, ordering keys resumed), not
// given to the Google client, whose debug logs hold message data;
// [WithClientOptions] adds Google client options. adapters.WithMeterProvider
// and adapters.WithTracerProvider are refused (the adapter has no metrics
// or spans of its own, and does not turn on the Google client's tracing),
// and so are adapters.WithTLSConfig (the client sets up its TLS; pass gRPC
// dial options with WithClientOptions) and another adapter's option.
//
// # Source
//
// NewSource reads the subscription (pubsub.subscriptions.get, in
// roles/pubsub.viewer), checks it against the consumer's retry policy
// (Config.Retry, max_attempts=; see "Dead letters" and "Delayed retries"
// below) and derives its [adapters.Capabilities] from it:
//
//   - In flight: the client's flow control (Config.MaxOutstandingMessages,
//     max_outstanding=) bounds the messages received and not settled; the
//     client hands them to Receive one by one, and the engine's own bound
//     (its buffer) applies on top.
//   - Ack after work: Ack acks (msg.Ack) only when the engine settles the
//     message. On an exactly-once subscription it acks with AckWithResult
//     and awaits the result: a failed one is logged and returned as an
//     error wrapping adapters.ErrReceiptInvalid, which the engine counts as
//     "may be redelivered", never as done.
//   - Streams: Config.Streams (streams=, default 1) streaming-pull streams,
//     each of bounded throughput, sharing the flow control.
//   - Leases: the client extends each delivery's ack deadline itself
//     (Config.AckDeadline per extension), up to Config.MaxExtension
//     (max_extension=, default 60m): a handler that outlives the ack
//     deadline keeps its delivery, it is not delivered again. Line
//     MaxExtension up with the handler: with Config.HandlerTimeout
//     (handler_timeout=) a MaxExtension below it is refused, a zero one
//     covers every attempt in place (MaxAttempts × HandlerTimeout plus the
//     longest retry delays), and one set below that is a warning. A
//     delivery held past MaxExtension is a warning naming max_extension
//     as it happens (the source looks every quarter of MaxExtension), is
//     no longer Valid (the engine releases it unrun), and its settle fails
//     with ErrReceiptInvalid, for Pub/Sub may have delivered it again. Capabilities.Lease is 0 and ExtendLease does
//     nothing.
//   - Attempt: with a dead-letter policy on the subscription, Pub/Sub's
//     DeliveryAttempt (Capabilities.DeliveryCount true; it survives
//     restarts). Without one, Pub/Sub sets no count, and the source counts
//     the attempts it was told failed (Nack) itself, in memory, not in a
//     header: a nack cannot carry one, so a restart starts over at 1
//     (Capabilities.DeliveryCount false). Attributes never set it: a
//     producer's ackwise-attempt is ignored.
//   - Delayed retries: Pub/Sub redelivers a nacked message after the
//     subscription's RetryPolicy backoff, never after a delay the nack
//     names, and ackwise does not republish with a due time (Pub/Sub has
//     no delayed delivery, and a republish to the topic would reach every
//     subscription). So Capabilities.Delay is true only for a RetryPolicy
//     whose minimum and maximum backoff are equal: that fixed backoff is
//     the one delay tier and MaxDelay, and Nack redelivers after it
//     whatever delay it is given; a consumer retry schedule (Config.Retry)
//     whose delays differ is a warning naming both (the consumer's own
//     delays hold when it retries in place). With an exponential backoff
//     or none (a nack redelivered at once) Delay is false, Nack returns an
//     error, and the consumer retries in place, with its own delays.
//   - Release nacks, for redelivery as soon as the retry policy allows; it
//     is not counted as an attempt. A delivery is nacked no sooner than
//     250ms after it arrived: the client confirms each receipt with an ack
//     deadline, batched every 100ms, and a nack sent before it would be
//     undone by it (the message then waits out its ack deadline).
//   - Dead letters, in one of two modes, picked by dead_letter_topic=
//     (Config.DeadLetterTopic):
//     ackwise-managed (set): DeadLetter publishes to that topic the
//     message's data byte for byte and its attributes with the dlq.Envelope
//     added (dlq.Envelope.Apply: credentials left out), its ordering key as
//     attribute ackwise-key ([HeaderKey]; a message received with it and
//     no ordering key gets it back as Key, so that a redrive publishes it
//     on its key); once Pub/Sub confirmed the publish it acks the message.
//     A publish not confirmed leaves the message unsettled. A dead-letter
//     policy on the subscription may stay as a backstop, but ackwise's max
//     attempts must not be above its MaxDeliveryAttempts (nor unlimited),
//     or NewSource refuses, naming both: Pub/Sub would forward first,
//     without the envelope.
//     Broker-managed (empty, with a dead-letter policy): Pub/Sub forwards a
//     message, as it is (no envelope), once it was delivered
//     MaxDeliveryAttempts times; ackwise's max attempts must equal it, or
//     NewSource refuses, naming both. DeadLetter then fails with an error
//     wrapping errors.ErrUnsupported, and the engine hands the message back
//     (Release), a delivery Pub/Sub counts.
//     Neither (no topic, no policy): a warning; DeadLetter fails as above
//     and a message that keeps failing comes back for ever. That is how
//     the dlq tools read a dead-letter subscription.
//   - Ordered: with message ordering enabled on the subscription, Pub/Sub
//     delivers a key's messages in publish order, and the engine handles
//     them one at a time (one lane per key), the keys in parallel.
//   - Exactly-once subscriptions: Ack awaits AckWithResult (see "Ack after
//     work"); a failed result is a warning and "may be redelivered", which
//     the engine observes as consumer.SettleFailed, never as Acked.
//   - Close first waits until the acks and nacks of the settles before it
//     went out (the client sends them in 100ms batches, and drops those
//     not sent when it stops): up to 250ms after the last settle or
//     receipt. Then it stops the client, which stops its stream and nacks
//     in one call every delivery not settled, those the engine holds and
//     those not yet handed to Receive; it waits up to 30s for that. A
//     settle after Close fails. Messages in transit when the stream stops
//     come back after their ack deadline (Config.AckDeadline).
//
// A message's Headers are its attributes, sorted by key; its ID is the
// attribute ackwise-event-id, its Key the ordering key (or, without one,
// the attribute ackwise-key, which is then not among the Headers), its
// BrokerID the Pub/Sub message ID, its Source the subscription's full
// name.
//
// # Dead-letter tools
//
// ackwise dlq inspect, stats and redrive take gcppubsub:// URLs: the
// dead-letter topic's subscription as the source (without
// dead_letter_topic=), a topic as the redrive's target. The Source is no
// dlq.Backlogger: Pub/Sub's data plane has no message count (the backlog
// is a Cloud Monitoring metric), so stats says the depth is unknown rather
// than 0, and a redrive runs until idle. Nor is it a dlq.Ager: the age of
// the oldest unacknowledged message is the Cloud Monitoring metric
// subscription/oldest_unacked_message_age, and a pull to look at one
// counts as a delivery attempt toward the subscription's dead-letter
// policy; stats prints the age of the oldest dead letter of its sample. A message released at the end of
// a run may be in transit to the closing client; it comes back after its
// ack deadline, for the next run.
//
// # Sink
//
// The Sink publishes with message ordering enabled: a message's Key is its
// ordering key. Attributes are the headers (the last value of a repeated
// key; the engine's hop headers dropped) and the event ID
// (Message.EventID) as ackwise-event-id. Publish awaits every result and
// reports failures per message (*adapters.PublishError). A failure on an
// ordering key pauses the key in the client, and fails the key's later
// messages too; Publish resumes the key (ResumePublish) once every result
// is in, and each such failure's error says the key was resumed: a
// message published again may then come after messages of its key
// published since. SinkConfig.Publish tunes the client's batching.
package gcppubsub
