// Package adaptertest is the conformance suite every ackwise adapter passes:
// the contract of [adapters.Source] and [adapters.Sink], checked against the
// real broker (or its emulator), through the adapter alone and under the
// consumer engine.
//
// # What it checks
//
// Publishing and receiving (payload, key and headers byte for byte, the
// engine's hop headers dropped, per-message publish errors), settling
// (ack, a redelivery after a crash before the ack, redelivery delays,
// attempt counts, dead letters that keep everything, a second settle and a
// settle after Close refused), per-key order under concurrency, restarts
// and drains that lose nothing, the in-flight bound, leases extended or run
// out, and a released message not overtaken by the others of its key.
//
// Batch handlers (consumer.NewBatch) on the broker: a poison message is
// dead-lettered alone, whether its handler reports it in a
// [ackwise.BatchError] or fails its whole batch; the other messages are
// acked once, at their first attempt, and stay acked across a restart; a
// batch never holds two messages of a key, and each key's messages succeed
// in publish order where the source delivers keys in order and retries wait
// in place.
//
// Each optional part a source declares in its [adapters.Extensions] is
// checked: a Recycler's recycled messages are handed out again whole while
// those still in flight stay intact; a BatchAcker's AckBatch acks as Ack
// does, reports per message and refuses a second settle; a Detacher's
// Detach gives the payload memory of its own and changes nothing else; an
// Invalidator's f is called after an invalidating event (Fixture.Invalidate,
// or Close), once Valid is false for the deliveries lost.
//
// A case a broker cannot support by design is decided by what the source
// declares (its Capabilities) or by a Fixture hook left nil, and calls
// t.Skip saying what it did not check and why: go test -v and -json report
// it as skipped, never as passed.
//
// # Running it for a new adapter
//
// In the adapter's package, a test calls [Run] with a [Harness]:
//
//	func TestConformance(t *testing.T) {
//		adaptertest.Run(t, adaptertest.Harness{
//			Open: func(t testing.TB, cfg adaptertest.FixtureConfig) adaptertest.Fixture {
//				// Create a destination with a unique name, shaped as cfg asks
//				// (lease, partitions, delay tiers); delete it in t.Cleanup.
//				return adaptertest.Fixture{Sink: ..., NewSource: ..., DeadLetters: ...}
//			},
//		})
//	}
//
// Every case opens its own destination, so the cases do not see each other's
// messages; they run one after the other. A broker that cannot be reached
// fails the test (it does not skip).
//
// # The harness
//
// [Harness.Open] creates a fresh destination shaped by a [FixtureConfig]
// (Lease, Partitions, MaxAttempts, DelayTiers) and returns a [Fixture]: its
// Sink, NewSource (a new consumer on the destination; opening one after
// closing another models a restart), DeadLetters (what reached the
// dead-letter destination), Refuse (optional: make the broker refuse one
// message alone) and Invalidate (optional: an event that takes deliveries
// from a source, such as a partition revoked or a connection closed by the
// broker; nil means the suite closes the source). [Harness.Timeout] bounds every wait for the broker;
// zero means [DefaultTimeout].
//
// [RedriveRun] is a helper for an adapter's own redrive tests.
package adaptertest
