// Package ops wires what a worker example needs to be operated: metrics
// exported to Prometheus, traces (to stdout or nowhere), JSON logs, and the
// HTTP server that serves the Runner's probes and the scrape. Nothing in it
// is global: the providers are passed to ackwise explicitly.
//
// It is internal to the examples (examples/rabbitmq-worker,
// examples/kafka-worker); a service would swap the stdout trace exporter
// for OTLP (go.opentelemetry.io/otel/exporters/otlp/otlptrace) and keep the
// rest.
package ops
