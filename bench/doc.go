// Package bench holds side-by-side benchmarks of ackwise against the raw
// broker clients and against peer libraries (Watermill). It is a module of its
// own so that the SDK never depends on the peers it is measured against.
package bench
