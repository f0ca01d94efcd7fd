// Package kafka is the ackwise adapter for Apache Kafka, built on franz-go
// (github.com/twmb/franz-go/pkg/kgo).
//
// # Consumer-group source
//
// [NewSource] joins a consumer group with automatic commits disabled and
// commits only settled offsets (invariant 2): every delivered record is
// tracked per partition, Ack, a confirmed move to a retry topic, a confirmed
// dead letter all mark a record settled, and the committed offset of a
// partition is the offset of its first unsettled record (or the offset after
// the last delivered one when all are settled). Records of one partition may
// therefore be handled in parallel by key, as Confluent's Parallel Consumer
// does, and settled out of order: the commit never passes unfinished work.
//
// Like the Parallel Consumer, a commit also carries, in the offset commit's
// metadata, the offsets above the committed one that are already settled;
// the next owner of the partition (another member, or this one after a
// crash) skips them, so a crash in the middle of a batch replays only the
// records that were not settled. The set is bounded to fit Kafka's default
// metadata limit; past it, more records replay, none is lost.
//
// Commits happen at most once per [SourceConfig.CommitInterval] while something was
// settled, synchronously when partitions are revoked (before they are
// released to another member), and on Close. The source reads with
// read_committed isolation: records of aborted transactions are never
// delivered.
//
// Receive takes everything the client has fetched at once (at most
// [SourceConfig.PollBatch] records when set), so that franz-go fetches the next
// batch while these are handled, and hands them out len(buf) at a time;
// records of a partition revoked meanwhile are dropped. It takes the next
// fetch as soon as the client has it, while the last is still being handed
// out: the records held are bounded by about three times
// [SourceConfig.FetchMaxBytes] per broker, in bytes as fetched (compressed
// batches take their uncompressed size). A delivered message's Payload is
// not copied: while its handler runs it keeps the fetch it came from alive
// (its record batch, when compressed). The engine has a message that starts
// waiting in place (a retry, a failed move tried again, a held redelivery,
// the open breaker) copy its payload first ([Source.Detach]), so a waiting
// message keeps only its own bytes (docs/kafka.md, Memory).
//
// A released record ([Source.Release]: shutdown, including a move still
// failing when the drain began) is never committed past; while this member
// keeps its partition, the source rewinds the partition's fetch position to
// it, so it is delivered again (records after it that were delivered before
// are fetched again and skipped). Records of the partition fetched but not
// yet delivered wait for it (they are fetched again after it), so none
// overtakes its redelivery. A released record gone from the log by the time
// the rewind fetches it (compaction, retention) is given up with a warning.
//
// A revoked partition's records become invalid: [Source.Valid] reports false
// and a later settle returns an error wrapping [adapters.ErrReceiptInvalid];
// records of a revoked partition that were fetched but not yet delivered are
// dropped, never handed out. On revocation the source first waits up to
// [SourceConfig.RevokeTimeout] for handlers already running on the partition to
// settle, so that their work is committed rather than repeated by the next
// owner; records waiting in the engine (a retry in place, a failed move
// tried again, a record held by the open breaker) are handed back at once
// ([Source.OnInvalid]), not when their waits end. franz-go heartbeats in
// the background, and a rebalance waits only while a poll's records are
// filed under their partitions (BlockRebalanceOnPoll) and, on revocation,
// for at most RevokeTimeout, so a slow handler never gets the member evicted.
//
// # Retries: blocking or retry topics
//
// Each source picks one of two retry modes:
//
//   - Blocking (no [SourceConfig.RetryTiers], the default): Capabilities.Delay is
//     false and the consumer engine retries a failed record in place. Order
//     per key is kept; the key waits.
//   - Non-blocking retry topics (Uber's and Spring Kafka's pattern): with
//     RetryTiers set, Nack produces the record to the retry topic of the
//     smallest tier at least as long as the asked delay (the longest tier when
//     none is), with acks=all, waits for the broker's confirmation and only
//     then marks the source record settled (invariant 3). Throughput wins,
//     and per-key order is given up: a retried record is handled after later
//     records of its key. The consumer engine's default (RetryAuto) uses the
//     retry topics whenever RetryTiers are set; consumer.RetryInPlace keeps
//     retries in place, and per-key order, with them.
//
// Retry topics are named by [SourceConfig.RetryTopic], by default
// [DefaultRetryTopic]: "<topic>.retry.<tier>", for example orders.retry.1m
// and orders.retry.10m; dead letters go to [SourceConfig.DeadLetterTopic], by
// default "<topic>.dlq". The same source consumes the main topic and all its
// retry topics in the same group, so one Source runs the whole chain. A hop
// carries the headers ackwise-attempt (incremented per hop),
// ackwise-first-failure, [HeaderRetryDue] (when the record is due), and
// [HeaderOriginalTopic], [HeaderOriginalPartition], [HeaderOriginalOffset]
// (where the record first sat), and [HeaderRetryGroup] (the group that moved
// it: groups on the same topic share its retry topics, and each handles only
// the records it moved, settling the others unseen); the original key, value
// and headers are kept.
// A retry-topic partition whose head record is not yet due is paused with
// PauseFetchPartitions and resumed when it is due: nothing sleeps, and the
// main topic and the other tiers keep flowing. A record is held at most its
// tier from when this member reads it, whatever its due header says, so a
// member whose clock ran ahead cannot stall a retry partition. Because a
// resumed partition joins the next fetch only after the fetch in flight
// returns, a source with tiers sets franz-go's FetchMaxWait to half the
// shortest tier (between 100ms and the default 5s). Retry topics must exist
// before the source starts ([CreateTopics] creates the whole chain with the
// topic's partition count). A record from a retry topic is delivered as a
// message of the original topic: Source, Partition and Offset name where it
// first sat, Attempt and FirstFailure come from its headers, and BrokerID
// names the retry-topic position it was read from. On the main topic those
// headers are not this chain's (a handler that forwarded the headers of a
// retry it handled put them there, or a producer forged them): a record read
// from it is attempt 1 with no first failure, at its own position, whatever
// ackwise-attempt, ackwise-first-failure and the original-position headers
// say; the headers stay in Message.Headers, and a move to a retry topic
// writes the engine's own. On retry topics they are read strictly (decimal
// digits only) and an attempt counts as at most 1<<20, the next hop's
// saturating there. [Sink.Publish] and TransactSession outputs drop
// ackwise-attempt and ackwise-first-failure, so a message forwarded with them
// does not carry them on.
//
// # Dead letters
//
// DeadLetter produces the record to the dead-letter topic with the same key,
// a byte-identical value, its headers kept and the dlq envelope added as
// Kafka record headers (any Kafka client, kcat included, reads them), with
// acks=all, and marks the source record settled once the broker confirmed.
// A dead letter too large for the dead-letter topic's max.message.bytes is
// written trimmed instead (the largest original headers left out first,
// then the value cut), marked with [HeaderDLQTrimmed] carrying the whole
// value's size and SHA-256, never tried again for ever; a record whose copy
// does not fit its retry topic is dead-lettered (reason unroutable) instead
// of moved. See docs/kafka.md.
//
// A Source tells the depth and the age of what its group has yet to read,
// also on a dead-letter topic: Source.Backlog (dlq.Backlogger: end offsets
// less the group's commits) and Source.Oldest (dlq.Ager: when the first
// unread record of each partition with a backlog was dead-lettered, by its
// envelope's last failure, else its timestamp; the earliest of them).
// Oldest fetches those records with a client of its own that joins no
// group and commits nothing, so the group's consumers are not disturbed.
// dlq.NewDepthMetrics reports both as ackwise.dlq.depth and
// ackwise.dlq.oldest.age, and the ackwise CLI's dlq stats prints them.
//
// # Sink
//
// [NewSink] publishes with acks=all and idempotent writes (franz-go's
// defaults; NewSink and the sources refuse Options that turn either off),
// partitions
// by key, sets ackwise-event-id from Message.ID, and reports produce errors
// per record in an [adapters.PublishError] (those retrying cannot cure, such
// as a record too large, marked ackwise.Permanent; NewSink batches under
// the topic's max.message.bytes, so such a record fails alone, though a
// batch over a limit lowered later is refused as a whole; the sources
// batch their retry moves and dead letters under their topics' limits the
// same way).
// Publish returns when its context ends before the broker confirmed, listing
// the records still unconfirmed with ctx's error (they may still be
// written). Close flushes; a record it fails, as a Publish after it,
// matches adapters.ErrClosed.
//
// # Share groups
//
// [NewShareSource] consumes as a member of a KIP-932 share group ("queues
// for Kafka"): each record is settled on its own (Ack accepts, Release hands
// it back, Reject archives, DeadLetter moves it then accepts), Attempt is the
// broker's delivery count, and members may share a partition (no order).
// Because franz-go auto-accepts a poll's unsettled records on the next poll,
// the share source does not poll again before every record of the previous
// poll is settled, and it gives every settled record an explicit status (a
// record whose lock ran out is released, never left to be accepted).
// ExtendLease renews the lock (AckRenew, Kafka 4.2 or later), sent at once;
// on older brokers nothing renews locks, Capabilities reports no
// ExtendLease and ExtendLease fails (see [ShareSource]). A renewed record
// stays valid for a lease from the renewal, past the lock deadline franz-go
// reported at fetch time. A settle or renewal within half the lease of the
// lock's end is sent in a request of its own, because the broker refuses a
// partition's acknowledgements in a request all or nothing. The lock's length (the
// source's Capabilities.Lease, which the engine renews at a third of where
// the brokers renew) is read
// when the source opens: the group's share.record.lock.duration.ms, else the
// broker's group.share.record.lock.duration.ms, else 30s.
//
// A share source has no Delay, so the engine retries a transient failure in
// place, the record locked to the member; since the source polls only once
// the last poll is settled, a record waiting for its retry holds back the
// member's next poll for its whole wait. A record handed back to the broker
// (released at shutdown, or its lock lost) spends a delivery, and at the
// group's group.share.delivery.count.limit (5 by default) the broker
// archives it: neither handled nor dead-lettered, and unseen by ackwise. A
// dead letter the broker refuses is tried again in place by the engine, the
// record kept locked, and spends no delivery. Closed under a running engine,
// the share source tells it ([ShareSource.OnInvalid]): records waiting in
// place go back at once and Run ends, instead of at their timers. Nothing
// else voids its records as an event (a lock runs out with time; franz-go
// reports no lost share session), so nothing else is told.
//
// # Exactly-once Kafka to Kafka
//
// [NewTransactSession] is an opt-in consume-transform-produce mode on
// franz-go's GroupTransactSession: a batch's outputs and its input offsets
// commit in one transaction, so read_committed consumers see each output
// exactly once, across aborted attempts and rebalances. A batch must end
// within the producer's transaction timeout (kgo.TransactionTimeout, 40s by
// default, counted from its first output): the broker aborts a longer one,
// and Run ends with an error matching [ErrTransactionTimeout] (or, where
// franz-go recovers from the abort, logs it and consumes the batch again);
// a batch still running at 80% of the timeout is logged at Warn level.
//
// # URL
//
// Importing the package registers the scheme "kafka" with
// [adapters.Register]; see [ParseURL] for the parameters and the options
// ([adapters.OpenOption]) the scheme takes: a logger, meter and tracer
// providers, a TLS config and franz-go options ([WithClientOptions]). A
// sink's URL is read with [ParseSinkURL], which refuses the parameters only
// a source uses. The parameters are read by the adapters' shared strict
// parser: errors name the URL parameter, never a Go field.
package kafka
