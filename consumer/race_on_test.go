//go:build race

package consumer_test

// raceEnabled scales the outage simulation down under the race detector,
// which slows every handler run about tenfold; `make test` also runs the
// full-scale simulation without -race.
const raceEnabled = true
