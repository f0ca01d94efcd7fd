// Package gcppubsub is the ackwise adapter for Google Cloud Pub/Sub, on
// cloud.google.com/go/pubsub/v2. A [Source] receives from one subscription
// through the client's streaming pull; a [Sink] publishes to one topic and
// awaits every result. Both implement the contract of package adapters, and
// the package registers the URL scheme gcppubsub with [adapters.Register],
// in gocloud.dev's form:
//
//	gcppubsub://projects/<project>/subscriptions/<subscription>?dead_letter_topic=<topic>   (source)
//	gcppubsub://projects/<project>/topics/<topic>                                           (sink)
//
// The parameters, each for a source, a sink or both; one the other side
// uses is an error naming it, and so is an unknown, repeated or empty one,
// a bad value and a malformed query (errors match adapters.ErrBadURL):
//
//	parameter          type                    side    meaning
//	endpoint           host:port               both    Pub/Sub API endpoint (a regional one), TLS and default credentials
//	emulator           host:port               both    an emulator: plaintext, no credentials, as PUBSUB_EMULATOR_HOST
//	dead_letter_topic  string                  source  topic ackwise dead-letters to (an ID, or projects/P/topics/T); required
//	max_outstanding    int ≥ 1                 source  flow control: most messages received and not settled (default 100)
//	ack_deadline       duration in [10s,600s]  source  ack deadline asked per extension (default: the client's, 60s at first)
//	max_extension      duration                source  longest the client extends a delivery (default 60m)
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
// roles/pubsub.viewer) and derives its [adapters.Capabilities] from it:
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
//   - Leases: the client extends each delivery's ack deadline itself
//     (Config.AckDeadline per extension), up to Config.MaxExtension
//     (max_extension=, default 60m). Keep MaxExtension above the consumer's
//     handler timeout plus its retries in place: a delivery held past it is
//     no longer Valid (the engine releases it unrun), and its Ack logs a
//     warning and fails with ErrReceiptInvalid, for Pub/Sub may have
//     delivered it again. Capabilities.Lease is 0 and ExtendLease does
//     nothing.
//   - Attempt: with a dead-letter policy on the subscription, Pub/Sub's
//     DeliveryAttempt (Capabilities.DeliveryCount true; it survives
//     restarts). Without one, Pub/Sub sets no count, and the source counts
//     the attempts it was told failed (Nack) itself: in memory, so a
//     restart starts over at 1 (Capabilities.DeliveryCount false).
//     ackwise's own max attempts apply either way; a dead-letter policy on
//     the subscription forwards on its own count, which this version does
//     not check against ackwise's.
//   - Delay: Pub/Sub redelivers a nacked message after the subscription's
//     RetryPolicy backoff, never after a delay the nack names. So
//     Capabilities.Delay is true only for a RetryPolicy whose minimum and
//     maximum backoff are equal: that fixed backoff is the one delay tier
//     and MaxDelay, and Nack redelivers after it whatever delay it is
//     given. With an exponential backoff or none (a nack redelivered at
//     once) Delay is false, Nack returns an error, and the consumer
//     retries in place.
//   - Release nacks, for redelivery as soon as the retry policy allows; it
//     is not counted as an attempt. A delivery is nacked no sooner than
//     250ms after it arrived: the client confirms each receipt with an ack
//     deadline, batched every 100ms, and a nack sent before it would be
//     undone by it (the message then waits out its ack deadline).
//   - DeadLetter publishes to the dead-letter topic (dead_letter_topic=,
//     Config.DeadLetterTopic) the message's data byte for byte and its
//     attributes with the dlq.Envelope added (dlq.Envelope.Apply:
//     credentials left out), its ordering key as attribute ackwise-key
//     ([HeaderKey]); once Pub/Sub confirmed the publish it acks the
//     message. A publish not confirmed leaves the message unsettled.
//   - Ordered: with message ordering enabled on the subscription, Pub/Sub
//     delivers a key's messages in publish order, one lane per key.
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
// attribute ackwise-event-id, its Key the ordering key, its BrokerID the
// Pub/Sub message ID, its Source the subscription's full name.
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
