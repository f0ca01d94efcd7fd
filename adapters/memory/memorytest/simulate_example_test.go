package memorytest_test

import (
	"context"
	"fmt"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
)

// A test calls memorytest.Simulate(t, sim); Trace runs one seed and returns
// its timeline, here the first seed that breaks "each order charged once"
// for a handler that charges, then acks, without an inbox.
func ExampleSimulation_Trace() {
	sim := memorytest.Simulation[map[string]int]{
		Workload: []*ackwise.Message{
			memorytest.Msg("m1", "order-101", "charge"),
			memorytest.Msg("m2", "order-102", "charge"),
			memorytest.Msg("m3", "order-103", "charge"),
		},
		Init: func(*memorytest.SimEnv) map[string]int { return map[string]int{} }, // the durable charges
		Setup: func(env *memorytest.SimEnv, charges map[string]int) ackwise.Handler {
			return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
				charges[msg.ID]++
				return nil // the engine acks after the work
			})
		},
		Check: func(env *memorytest.SimEnv, charges map[string]int) error {
			for id, n := range charges {
				if n > 1 {
					return fmt.Errorf("%s charged %d times", id, n)
				}
			}
			return nil
		},
		Faults: memorytest.FaultRates{CrashBeforeAck: 0.2},
	}
	for seed := uint64(1); ; seed++ {
		tr, err := sim.Trace(seed)
		if err != nil {
			panic(err)
		}
		if tr.Violation != nil {
			fmt.Printf("seed %d: %v\n%s", seed, tr.Violation, tr.Timeline())
			return
		}
	}
	// Output:
	// seed 3: m1 charged 2 times
	//    +0.000s  p1  start: 3 messages, queue mode
	//    +0.000s  p1  m1 [order-101] d1 a1  delivered
	//    +0.020s  p1  m1 [order-101] d1 a1  handled: ok
	//    +0.020s  p1  m1 [order-101] d1 a1  fault: crash-before-ack: the process dies before its settle reaches the broker
	//    +0.020s  p1  crash: in-memory state and timers lost; restart in 1s
	//    +1.020s  p2  restart: Setup builds a new handler from the durable state
	//    +1.020s  p2  m2 [order-102] d1 a1  delivered
	//    +1.028s  p2  m2 [order-102] d1 a1  handled: ok
	//    +1.028s  p2  m2 [order-102] d1 a1  acked
	//    +1.028s  p2  m3 [order-103] d1 a1  delivered
	//    +1.033s  p2  m3 [order-103] d1 a1  handled: ok
	//    +1.033s  p2  m3 [order-103] d1 a1  acked
	//   +30.000s  p2  m1 [order-101] d2 a2  delivered
	//   +30.005s  p2  m1 [order-101] d2 a2  handled: ok
	//   +30.005s  p2  m1 [order-101] d2 a2  acked
	//   +30.005s  p2  quiet: every message settled
	//   +30.005s  p2  check: fails: m1 charged 2 times
}
