// Package memorytest holds one-line test helpers for code that runs on the
// in-memory broker (package memory), in the spirit of River's rivertest:
//
//	memorytest.Publish(t, b, "orders", memorytest.Msg("evt-1", "cust-7", `{"total":42}`))
//	... run the consumer ...
//	memorytest.WaitForAcked(t, b, "orders", "evt-1")
//	dl := memorytest.WaitForDeadLettered(t, b, "orders", "evt-2", dlq.ReasonPermanent)
//	memorytest.RequireHandledInOrder(t, b, "orders", "cust-7")
//
// Require* helpers check the broker's history as it is now and fail the test
// at once (t.Fatalf) when it does not hold. WaitFor* helpers wait until the
// history satisfies the condition, woken by each new event (never polling or
// sleeping), and fail the test after DefaultTimeout of real time or at the
// test's deadline, whichever comes first. On failure each helper prints the
// history of the message or key concerned.
//
// The helpers: NewBroker, Msg, Publish and Receive to drive a test; RequireAcked,
// RequireNotAcked, RequireNacked, RequireDeadLettered, RequireNotDeadLettered,
// RequireDeliveries, RequireHandledInOrder, RequireCommitted and RequireEmpty
// to assert; WaitForAcked, WaitForAckCount, WaitForDelivered, WaitForNacked,
// WaitForDeadLettered, WaitForCommitted and the general WaitFor to wait
// for the history, WaitForTimer for a timer of the virtual clock;
// Events for the raw history of one message; Inject for a fault removed at
// the end of the test; UniqueName for destination names.
//
// Event IDs are Message.ID (the ackwise-event-id header). Every helper takes
// the queue or topic name as dest; the history must be on
// (memory.Config.DisableHistory false).
//
// QueueHarness and LogHarness connect the broker to the adapter conformance
// suite (package adaptertest).
//
// Simulate runs a handler (its middleware, inbox store and retry policy
// included) through many seeded schedules of combined faults: crashes
// before and after the ack, lost acks, duplicates, redeliveries that
// overtake newer messages of their key, log rebalances, publish failures,
// dependency outages and lost replies. Each seed is a single-threaded
// discrete-event simulation on a virtual clock, so with one worker it
// replays exactly (-simulate.seed=N); a failure is reported with its seed,
// its shrunk fault schedule and that schedule's timeline. See
// docs/testing.md, "Simulating combined faults".
package memorytest
