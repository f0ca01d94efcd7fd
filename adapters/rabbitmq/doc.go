// Package rabbitmq is the ackwise adapter for RabbitMQ, on
// github.com/rabbitmq/amqp091-go. A [Source] consumes one queue with manual
// acknowledgements; a [Sink] publishes with publisher confirms. Both
// implement the contract of package adapters, and the package registers the
// URL schemes amqp, amqps and rabbit with [adapters.Register]:
//
//	amqp://user:password@host:5672/orders?queue_type=quorum&prefetch=64&tiers=1s,10s,1m&declare=true
//
// The URL path is the queue; the vhost is the vhost parameter (default "/").
// Config.URL, by contrast, is a plain AMQP URI whose path is the vhost.
// The parameters, each for a source, a sink or both; one the other side
// uses (prefetch on a sink, exchange on a source) is an error naming it,
// and so is an unknown, repeated or empty one, a bad value and a malformed
// query:
//
//	parameter                 type               side    meaning
//	vhost                     string             both    virtual host (default /)
//	queue_type                classic or quorum  both*   type of every queue of the topology (default classic)
//	prefetch                  int in [0, 65535]  source  basic.qos prefetch count (0: 128)
//	tiers                     durations          both*   delay tiers, whole milliseconds, comma-separated (1s,10s,1m)
//	declare                   bool               both    declare the topology first
//	plain                     bool               source  consume the queue as it is (Config.Plain)
//	dlq                       string             both*   dead-letter queue (default QUEUE.dlq)
//	consumer_timeout          duration or -1     source  the broker's consumer_timeout (default 30m; -1: no warning)
//	consumer_timeout_warn     duration           source  warn and hand back after holding a delivery this long
//	heartbeat                 duration           both    AMQP heartbeat, from 1s (default 10s)
//	connection_name           string             both    connection_name client property (default ackwise)
//	exchange                  string             sink    exchange to publish to, instead of the path's queue
//	routing_key               string             sink    routing key (default: the message key on a named exchange)
//	tls                       bool               both    rabbit:// only: true for TLS
//	tls_ca                    file               both    PEM file of the CA certificates to trust
//	tls_cert, tls_key         files              both    PEM files of the client certificate and key
//	tls_server_name           string             both    server name to verify (default: the host)
//	tls_insecure_skip_verify  bool               both    true: do not verify the server (tests only)
//
// (*: a sink takes it only with declare=true, for the topology it declares.)
//
// Options of adapters.OpenSource and adapters.OpenSink: adapters.WithLogger
// is Config.Logger / SinkConfig.Logger (connection events, reconnections,
// consumer-timeout warnings); adapters.WithMeterProvider is
// Config.MeterProvider (a source's consumer-timeout warning counter; a sink
// has no metrics and refuses it); adapters.WithTracerProvider is
// Config.TracerProvider / SinkConfig.TracerProvider (a span around each
// move of Nack and DeadLetter, and around each Sink.Publish: [SpanNack],
// [SpanDeadLetter], [SpanPublish]); adapters.WithTLSConfig is the
// *tls.Config of an amqps:// URL (or rabbit:// with tls=true), used as it
// is: it is refused with an amqp:// URL, and beside the URL's tls_*
// parameters (set those in the config instead). Another adapter's option
// is refused (adapters.ErrUnsupportedOption).
//
// # Topology
//
// A source on queue Q uses, all durable and of Config.QueueType (classic or
// quorum):
//
//   - Q, the work queue, with x-dead-letter-exchange "" and
//     x-dead-letter-routing-key Q.dlq, so that what the broker itself
//     dead-letters (a quorum queue's delivery limit, a reject) lands in the
//     dead-letter queue too;
//   - one wait queue per delay tier named (Config.DelayTiers, tiers= in the
//     URL; without tiers there are none, Nack returns ErrNoTiers and the
//     consumer engine retries in place), Q.wait.<tier> (Q.wait.1s,
//     Q.wait.30s, Q.wait.5m; see [WaitQueueName]), with x-message-ttl = the
//     tier and x-dead-letter-exchange "" / x-dead-letter-routing-key Q: a
//     message published there comes back to Q when the tier has passed. The TTL is
//     per queue, not per message: per-message expiration is only enforced at
//     the head of a queue, so one long delay would hold back every shorter
//     one behind it;
//   - Q.dlq (Config.DeadLetterQueue), the dead-letter queue.
//
// Quorum queues that dead-letter are declared with
// x-dead-letter-strategy=at-least-once and x-overflow=reject-publish, so that
// a message moving from a wait queue back to Q is never lost in between
// (RabbitMQ 3.10 or later). Dead-lettering goes through the default
// exchange, which always exists.
//
// With Config.DeclareTopology (declare=true in the URL) the source declares
// all of it before consuming and again after every reconnection; [Declare]
// does the same once, for publishers that start first. Without it the
// source verifies before consuming that every queue exists and that every
// wait queue has exactly the TTL and dead-letter arguments above (by
// declaring it with them: RabbitMQ refuses with PRECONDITION_FAILED when an
// existing queue's arguments differ). A wait queue with a missing or wrong
// dead-letter target would silently drop or strand retries, so the source
// refuses to start with an error naming the queue and the arguments it
// expects. Topology set by policy instead of arguments fails that check.
//
// # Delivery and settlement
//
// The source consumes with manual acknowledgements; basic.qos
// Config.Prefetch bounds the deliveries the broker pushes before they are
// acknowledged. Set it at least as large as the engine's in-flight limit.
// Receive blocks for one delivery and then takes what has already arrived,
// without waiting, up to the buffer's length.
//
//   - Ack is basic.ack, sent only after the handler succeeded. Acks are
//     written by one writer per channel without making the caller wait, and
//     acks of contiguous deliveries are coalesced into one basic.ack with
//     multiple=true. A multiple ack never covers a delivery still being
//     handled or one released: it stops below the oldest unsettled delivery,
//     and acks above it are sent one by one at once, so a slow handler holds
//     back no other message's ack. Close writes what is left.
//   - Nack(msg, delay) publishes a copy to the wait queue of the smallest
//     tier at least delay long (the largest tier for longer delays), waits
//     for the publisher confirm, then acks the original (move before ack).
//     The copy keeps the payload byte for byte and every header but
//     x-delivery-count and the CC/BCC routing headers (which would route
//     the copy to more queues; RabbitMQ's own dead-lettering drops them
//     too), sets ackwise-attempt = Attempt+1 and ackwise-first-failure (the
//     first failure's time), keeps the properties but expiration and
//     user-id, and is persistent. The x-death history and its
//     x-first-death-* and x-last-death-* summaries travel only on a
//     return from a wait queue (see Attempts); a first delivery's are a
//     producer's, and are left out.
//   - DeadLetter publishes the same kind of copy to the dead-letter queue
//     with the dlq.Envelope headers added (an earlier envelope replaced)
//     and ackwise-attempt = Attempt, waits for the confirm, then acks the
//     original.
//   - A copy keeps the event ID its delivery had, or its lack of one.
//     Message.ID is the ackwise-event-id header, else the message-id. A
//     copy of a delivery without a message-id needs one (returns are
//     matched by it): it gets one starting with "ackwise-anon-", which no
//     source takes for an event ID. So a message a foreign producer sent
//     without either has no event ID on every hop, as on its first
//     delivery: an inbox that refused it (ErrNoEventID) refuses its copies
//     too, instead of keying them by an ID the adapter made up.
//   - Release is basic.nack with requeue=true.
//   - ExtendLease does nothing: RabbitMQ has no lease to extend (see Consumer
//     timeout).
//
// Moves are published on a connection of their own, with the mandatory flag:
// a wait or dead-letter queue that has disappeared makes Nack or DeadLetter
// fail with [ErrUnroutable], and the original stays unacknowledged.
//
// # Attempts
//
// Message.Attempt is 1 on a first delivery and counts as follows:
//
//   - a delivery is a return from a wait queue when its x-death history is
//     well formed (as RabbitMQ writes it: an array of tables with queue,
//     reason, exchange, count, routing-keys and time of their AMQP types,
//     no two for the same queue and reason, counts below 2^31) and its
//     newest entry says that one of the source's own wait queues (the names
//     the topology computes, not a prefix) dead-lettered it with reason
//     expired. A return's base is 1 plus the x-death counts of those wait
//     queues, or its ackwise-attempt header, which Nack sets on the copy it
//     moves (and which counts retries in place and redeliveries too), when
//     that is a plain decimal number at least that large and at most 2^20;
//   - any other delivery is a first delivery from a producer: its base is
//     1, whatever ackwise-attempt, x-death, x-first-death-* or
//     x-last-death-* it carries (they stay in Message.Headers, but no copy
//     the source makes carries them on, and its ackwise-first-failure is
//     not read into Message.FirstFailure);
//   - on a quorum queue, a redelivery (the redelivered flag set) adds its
//     x-delivery-count: the broker counts every earlier delivery of this
//     copy, so a crash or a Release counts and the count survives consumer
//     restarts (Capabilities.DeliveryCount). RabbitMQ writes the header on
//     redeliveries only; on a first delivery a producer's value arrives as
//     it was sent, and is not read;
//   - on a classic queue, which keeps no count, a redelivery adds one. This
//     is a lower bound: a message redelivered after several crashes counts
//     one extra attempt, not several. A message that kills its consumer
//     every time is therefore retried for ever on a classic queue; use a
//     quorum queue (with a delivery-limit policy if needed) where that matters.
//
// Sums saturate at 2^20, never wrapping around. A plain source has no wait
// queues, so every delivery counts as a first one.
//
// The source cannot tell a wait queue's ackwise-attempt and
// ackwise-first-failure from a producer's on a return: the work queue
// receives both from its wait queues. So the [Sink] does not publish them
// (nor x-death and its summaries): a handler that forwards the headers of
// a message it handled (a retry among them) does not make the new message
// start at that message's attempt. Only the source's own moves set them.
// AMQP gives a consumer no record of a hop that a producer cannot write: a
// producer that forges a complete, well-formed history of hops through
// this source's own wait queues can shorten that message's retries, down
// to a dead letter (reason max-attempts, to be redriven) after its first
// failure; it cannot crash or wedge the consumer, loop a move, or make the
// source hand the broker's dead-letter worker a malformed history.
// docs/rabbitmq.md says what to strip at the edge, and what only the edge
// can stop (a message the broker dead-letters from the work queue itself).
//
// # Publishing
//
// The sink, and the source's moves, publish with publisher confirms always
// on, the mandatory flag and delivery mode persistent. A Publish call writes
// its batch at once and awaits its confirms together; concurrent calls share
// the channel, so confirms are pipelined. Each message has its own outcome
// (the sink reports them in an [adapters.PublishError]): a message no queue
// takes comes back with basic.return and fails with ErrUnroutable (it is
// never dropped quietly); a basic.nack fails it with ErrNacked, read from
// the message's own deferred confirmation, so a nack a later multiple ack
// spans still counts. Returns are matched to messages by message-id,
// exchange and routing key; the sink's message-id is the event ID (a unique
// one when there is none), but on a redriven dead letter, which keeps its
// own. The copy dlq.Redrive publishes of a dead letter a Source delivered
// keeps the dead letter's AMQP properties (but expiration and user-id), its
// message-id and its header value types; see [Sink.Publish]. The sink marks
// a publish the broker refused by closing the channel (404, 403, 406)
// ackwise.Permanent. AMQP does not say which message of the channel was
// refused, so the unconfirmed messages are then sent again each alone on a
// channel of its own: only the refused one fails, not the others of its
// call nor the other calls that shared the channel.
//
// A message's properties and headers travel in one content header frame,
// which must fit in the connection's negotiated frame_max (131072 bytes on
// RabbitMQ by default): the broker closes the whole connection on a larger
// one. Every publish is measured first: a sink message that does not fit
// (or that amqp091-go cannot encode, such as a message-id over 255 bytes)
// fails alone with [ErrHeadersTooLarge] (or the encoding error), marked
// ackwise.Permanent, before anything is sent; a copy the source moves loses
// its largest headers until it fits (the event ID, the envelope and the hop
// headers last), named in [HeaderTrimmed], its payload unchanged.
//
// Headers named CC and BCC (in capitals, as RabbitMQ matches them) are
// RabbitMQ's sender-selected distribution: routing keys the message is
// also routed to, with the same exchange. The broker takes them only as an array of
// strings, so the sink sends every CC header's value, in order, as one
// element of the CC array (Headers.Add a CC header per routing key; a value
// is never split), and likewise BCC; the broker keeps CC on every copy and
// removes BCC. Moves the source makes (wait-queue hops, dead letters) drop
// both, as below.
//
// # Recovery
//
// When a connection or channel dies (a network failure, a broker restart,
// rabbitmqctl close_connection, the consumer timeout), the source and the
// sink reconnect in the background with exponential backoff and jitter
// (Config.ReconnectInitialInterval to ReconnectMaxInterval), redeclare or
// re-verify the topology, and resume. The schedule starts over only after a
// connection that stayed up for ReconnectMaxInterval: one lost again soon
// after each reconnection is made again ever more slowly, not in a storm.
// amqp091-go's own automatic recovery is not used.
//
// Each consuming channel is a generation, and a message's Handle holds its
// generation and delivery tag. Delivery tags mean nothing on another channel,
// so a delivery from a dead generation is never acknowledged on a new one:
// Valid reports false, and Ack, Nack, DeadLetter and Release return an error
// wrapping adapters.ErrReceiptInvalid and do nothing. The broker redelivers
// those messages, and the idempotency inbox absorbs the repeats. A Nack or
// DeadLetter whose channel dies after its copy was confirmed leaves both the
// copy and the redelivered original: a duplicate, absorbed the same way. A
// Nack or DeadLetter waiting for the moves connection to come back returns
// ErrReceiptInvalid as soon as its delivery's channel dies.
//
// A Publish in progress when the channel dies waits for the new channel and
// sends the messages that were not confirmed again (so a message may be
// stored twice), until its ctx is done. While the broker refuses the
// reconnection for good (403: wrong user or password; 530: no access to the
// vhost), a Publish, or a move, waiting for a channel fails at once with
// the refusal marked ackwise.Permanent; reconnecting goes on in the
// background. Only a refusal the broker sends (connection.close) counts:
// the adapter advertises the capability authentication_failure_close, so
// RabbitMQ says when it refuses a login. A connection closed or reset
// mid-handshake, as by a broker restarting (or one that refuses logins
// without a word), is no refusal: Publish waits.
//
// # Unreadable deliveries
//
// amqp091-go refuses to read a header table or array nested deeper than 32
// levels or holding more than 8192 entries, and closes the whole connection
// when a delivery carries one, although RabbitMQ takes and delivers such a
// message from any producer. The broker would deliver it again, first, on
// every new connection, with the messages prefetched behind it: the
// consumer would stop for good, and on a quorum queue every close would add
// to the x-delivery-count of every message in flight. So the adapter reads
// the broker's frames before amqp091-go does (after TLS, which it does
// itself) and makes such a table readable: each entry amqp091-go could not
// read is passed on as a byte array holding its encoded value (the table's
// or array's bytes after its type and length), and the header
// [HeaderUnreadable] lists their names as a JSON array; entries that cannot
// be delimited, or that exceed 8192, go as one byte array to
// [HeaderUnreadableRest]. If the frame would then exceed frame_max, the
// values are dropped and only the names kept (as a last resort the names
// and the rest go too: the table is then no larger than it came). A warning names the
// connection, channel, message-id, the entries and the cause. The message
// is then delivered like any other: Message.Headers never holds tables, so
// the handler sees what it would have; moves and dead letters carry the
// byte arrays. Should amqp091-go still close a connection on a frame it
// cannot read (its own 501, not the broker's), the reconnection warning
// says so and reconnections slow down (see Recovery). ackwise declares no
// x-delivery-limit (see docs/rabbitmq.md for a policy as a backstop).
//
// # Consumer timeout
//
// RabbitMQ closes a channel on which a delivery stayed unacknowledged for
// longer than its consumer_timeout (30 minutes by default), and every
// delivery on that channel is redelivered. The time cannot be extended per
// delivery, so handlers must finish well within it. The source warns, with a
// log record and the counter ackwise.rabbitmq.consumer_timeout.warnings,
// about each delivery held for Config.ConsumerTimeoutWarn (80% of
// Config.ConsumerTimeout, which should match the broker's setting), counted
// as the broker counts it: from the delivery's arrival, time spent in the
// prefetch buffer before Receive included, and also while a delivery still
// waits there (an engine at its in-flight limit or paused). From then on
// Valid reports the delivery no longer valid (but on a Plain source, whose
// deliveries the dlq tools hold while they scan), and the engine hands it back
// (nack, requeue) rather than start its handler, its retry in place or
// another try of a failed move; a handler already running is not stopped,
// and its ack or move is still made. A hand-back is a redelivery: on a
// quorum queue it adds to x-delivery-count, so Message.Attempt, and on a
// classic queue the count of retries made in place is lost (the
// redelivery counts as attempt 2). Keep Prefetch near the engine's
// in-flight limit when handlers are slow, so that deliveries do not wait
// in the prefetch buffer until they are handed back unrun, and keep the
// waits of retries in place well within ConsumerTimeoutWarn. When the
// broker does close the channel, the reconnection log names the timeout as
// the likely cause.
//
// # Plain queues
//
// Config.Plain (plain=true in the URL) consumes a queue as it is, without
// the topology above: a dead-letter queue to inspect or redrive with
// dlq.Redrive or the ackwise CLI. Only the queue's existence is checked, and
// DelayTiers or DeadLetterQueue beside Plain are refused. Nack and
// DeadLetter return ErrPlain: the engine retries a transient failure in
// place (Capabilities.Delay is false), but a message it dead-letters (a
// permanent failure, its attempts run out) is handed back (nack, requeue),
// as after any settle that failed: ErrPlain wraps errors.ErrUnsupported,
// so the dead letter is not tried again in place. Such a message comes
// back and fails again, each redelivery held a little longer (up to 5s):
// consume a plain queue with a handler that does not fail permanently.
//
// Source.Backlog (dlq.Backlogger) tells dlq.Redrive how many messages the
// queue held when the source began to consume it, so that a run ends once
// it received them, also while a consumer that still fails sends dead
// letters back. Open a source per run: once it has received, its count is
// stale and Backlog returns an error.
//
// The Source is no dlq.Ager: AMQP 0-9-1 cannot read the age of a queue's
// oldest message without taking it. A peek would be a basic.get handed
// back with a requeue, and that is not harmless: on a quorum queue a
// return counts as a delivery (every return before RabbitMQ 4.3,
// basic.reject from 4.3 on), so a peek every scrape spends the message's
// x-delivery-limit and the broker dead-letters or drops it; on any queue
// the message is out of the consumers' reach while held and comes back
// marked redelivered; and with consumers attached the head is already
// delivered, so a get reads a younger message. The management plugin's
// head_message_timestamp is outside AMQP and is the timestamp property the
// publisher set, not when the message was dead-lettered. So
// ackwise.dlq.oldest.age is left out for RabbitMQ (or pass a dlq.AgerFunc
// of your own), and the ackwise CLI's dlq stats prints the age of the
// oldest dead letter of its sample, read from the queue's head.
//
// # Concurrency
//
// Receive is called from one goroutine at a time; Ack, Nack, DeadLetter,
// Release, ExtendLease and Valid may be called concurrently from many, as may
// Sink.Publish. Passwords never appear in logs or errors, nor where a Config
// or SinkConfig is printed (fmt, log/slog, encoding/json show its URL
// without the password).
package rabbitmq
