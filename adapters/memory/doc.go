// Package memory is an in-process broker with real semantics, for tests,
// examples and benchmarks of ackwise consumers and producers. It is not a
// channel: it behaves as the brokers ackwise runs on do, so that code tested
// on it meets no surprise in production.
//
// # Queues (like SQS, RabbitMQ)
//
// A queue ([Broker.CreateQueue], [Broker.QueueSource]) leases each delivered
// message for its visibility timeout ([QueueConfig.Lease]); a message neither
// acked nor nacked in time is delivered again. The broker counts receives
// (Message.Attempt, Capabilities.DeliveryCount), redelivers after a Nack's
// delay, extends leases, and, with [QueueConfig.MaxReceives], moves a message
// to the dead-letter queue instead of delivering it once more (SQS's
// maxReceiveCount). Several sources on one queue are competing consumers. A
// FIFO queue ([QueueConfig.FIFO]) keeps at most one message per key in
// flight and delivers each key's messages in publish order. A source tells
// the engine (adapters.Invalidator, [QueueSource.OnInvalid]) when its
// deliveries stop being Valid on an event: it closes or crashes, or a
// duplicate delivery is settled through its twin; a lease that runs out is
// not told.
//
// # Logs (like Kafka)
//
// A topic ([Broker.CreateTopic]) has partitions; a record goes to the
// partition of murmur2(key), as with Kafka's default partitioner. Members of
// a consumer group ([Broker.JoinGroup]) share the partitions by range
// assignment, redone when a member joins, closes or crashes; deliveries of a
// partition a member lost become invalid (Valid is false, settles fail with
// adapters.ErrReceiptInvalid), and the member tells the engine at once
// (adapters.Invalidator, [GroupSource.OnInvalid]; so it does when SeekGroup
// resets one of its partitions or it closes or crashes), which hands back
// the messages of that partition waiting in place or held by the open
// breaker, as Kafka's revoke does. Ack marks a record settled, and the
// group's committed offset advances only over a settled prefix (invariant
// 2), so a new member resumes at the first unsettled record.
// [Broker.SeekGroup] replays or skips. Nack is not supported on a log (Capabilities.Delay is
// false: the engine retries in place); DeadLetter writes to "<topic>.dlq".
//
// # Time
//
// The broker reads time from its [Config.Clock]. A [VirtualClock] makes leases
// and delays run out only when a test advances it. Blocked receivers are
// woken by a publish or settle, or by one timer per queue set for the next
// deadline; nothing polls.
//
// # History, faults and outages
//
// The broker records what happens to each message ([Event]: published,
// delivered, acked, nacked, dead-lettered, released, expired, committed…);
// [Broker.History] and [Broker.WaitHistory] read it, and package memorytest
// turns it into one-line assertions. [Broker.InjectFault] and the sources'
// InjectFault inject deterministic faults ([Fault]): a crash between handler
// and ack, a lost ack, a failed ack, a duplicate delivery, a reordered batch,
// a failed or hung publish. A [Sink] reports a failed or hung publish per
// message, as the Kafka and RabbitMQ sinks do: an adapters.PublishError
// lists the matching message with the fault's error and the later ones as
// not attempted. [Broker.Outage] makes the broker unavailable for a window
// of clock time.
//
// # Cost
//
// Publish copies each payload into a shared arena and the headers into one
// slice (the only per-message allocation). A message's first
// delivery is embedded in the stored message itself, so Receive hands it out
// without a copy or an allocation; redeliveries (and deliveries to a second
// consumer group) copy the stored fields into deliveries carved from slabs.
// Ack finds its delivery through Message.Handle, without a lookup. Nothing
// runs per message in the background: no goroutine, timer or channel. On the
// system clock, Valid (always) and Ack (with history off and no outage)
// judge leases by the last Receive's clock reading rather than reading the
// clock per message; see QueueSource.Valid and QueueSource.Ack. Turn
// history off ([Config.DisableHistory]) and bound topics
// ([TopicConfig.Retention]) in long benchmarks.
//
// A delivered message's ID, Key, Payload, Headers, Source, Partition,
// Offset, BrokerID and PublishedAt are shared with its later deliveries: a
// receiver must not change them (nor the payload's bytes or the headers'
// entries). Attempt, FirstFailure and Handle belong to the delivery.
//
// # URLs
//
// Importing the package registers the "mem" scheme with adapters.Register:
// "mem://orders" is the queue orders on [Default], "mem://events?partitions=4&group=billing"
// a consumer-group member on a log; see [ParamLease] for the rules. The
// parameters (all taken by source and sink URLs alike):
//
//	parameter     type               meaning
//	lease         positive duration  queue: how long a delivery is leased before it is redelivered
//	max_receives  int ≥ 0            queue: deliveries before the broker dead-letters a message (0: no limit)
//	dlq           string             the dead-letter destination (default NAME.dlq)
//	fifo          bool               queue: deliver each key's messages one at a time, in order
//	partitions    int in [1, 65536]  log: number of partitions; makes the URL a log
//	retention     int ≥ 0            log: records kept per partition (0: all); makes the URL a log
//	group         string             log: the consumer group (a log source needs one); makes the URL a log
//
// Options of adapters.OpenSource and adapters.OpenSink: [WithBroker] opens
// the destination on another broker than [Default]. With
// adapters.WithLogger, WithMeterProvider or WithTracerProvider, the source
// or sink reports every injected fault that fires on it, and a source its
// crash (injected or by Crash): a Warn log record ("memory: injected fault
// fired", "memory: source crashed", with the fault's name), a count
// ([MetricFaults], [MetricCrashes], by [AttrFault]) and a span
// ([SpanFault]; a sink's is a child of Publish's context). They are called
// with the destination's lock held: the log handler, meter and tracer must
// not call the broker. adapters.WithTLSConfig is refused (no network), and
// so is another adapter's option, with an error wrapping
// adapters.ErrUnsupportedOption.
package memory
