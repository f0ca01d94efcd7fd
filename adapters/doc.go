// Package adapters defines the contract between the consumer engine and a
// broker: a [Source] delivers messages and settles them (ack, redeliver later,
// dead-letter, release), a [Sink] publishes with broker confirmation, and
// [Capabilities] says explicitly what a broker can do and [Extensions] which
// optional parts a source has, so the engine never discovers features by
// type assertion.
//
// The contract is shaped by the four brokers ackwise is built for (the SQS
// and Pub/Sub adapters are planned, not written yet):
//
//   - Kafka acks by committing offsets per partition (Capabilities.Log) and
//     delays by producing to retry topics;
//   - RabbitMQ acks per delivery tag, delays through wait queues with a
//     per-queue TTL, and counts deliveries with x-delivery-count;
//   - SQS deletes by receipt handle, delays and extends leases with
//     ChangeMessageVisibility, and counts with ApproximateReceiveCount;
//   - Pub/Sub acks per message, nacks into the subscription's retry policy and
//     extends leases inside its client.
//
// Adapters register a URL scheme with [Register]; [OpenSource] and
// [OpenSink] pick the adapter from the URL, so swapping brokers is a
// configuration change. What a URL cannot carry goes in options:
//
//	src, err := adapters.OpenSource(ctx, "amqps://user:pw@broker/orders?tiers=1s,1m",
//		adapters.WithLogger(logger),
//		adapters.WithMeterProvider(mp), adapters.WithTracerProvider(tp),
//		adapters.WithTLSConfig(tlsConfig))
//
// An adapter uses every option it is given or refuses to open, with an
// error wrapping [ErrUnsupportedOption] naming it: an option is never
// silently ignored. Adapter-specific options ([WithAdapterOption]) come as
// functions of the adapter's package; one adapter refuses another's.
// Each adapter's package documentation lists its URL parameters (which
// side, source or sink, takes each) and what it does with each option.
package adapters
