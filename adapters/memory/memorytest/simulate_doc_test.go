package memorytest_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/meminbox"
)

// The walk-through of docs/testing.md ("Simulating combined faults"),
// which TestTestingDocShowsTheSimulation keeps equal to it.
//
// docs/testing.md simulate: begin
// wallets is the durable state: what a crash does not lose.
type wallets struct {
	mu       sync.Mutex
	balance  map[string]int
	lastSeen map[string]string // wallet → the last event ID applied to it
	inbox    *meminbox.Store
}

// deposit adds a deposit to its wallet (the message key) and skips a
// repeat of the last event applied to that wallet, in the same
// transaction. The queue is FIFO per wallet, so a redelivery comes before
// anything newer of its wallet. Or so it seems.
func deposit(env *memorytest.SimEnv, w *wallets) ackwise.Handler {
	return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		amount, err := strconv.Atoi(string(msg.Payload))
		if err != nil {
			return ackwise.Permanent(err)
		}
		if err := env.Call(ctx, "fraud-check", func() error { return nil }); err != nil {
			return err // transient: retried
		}
		w.mu.Lock() // one transaction: the balance and the last event ID
		defer w.mu.Unlock()
		if w.lastSeen[msg.Key] == msg.ID {
			return nil // a repeat
		}
		w.lastSeen[msg.Key] = msg.ID
		w.balance[msg.Key] += amount
		return nil
	})
}

// depositsSim: 30 deposits into 5 wallets on a FIFO queue; the invariant
// is that each wallet holds the sum of its acked deposits.
func depositsSim(setup func(*memorytest.SimEnv, *wallets) ackwise.Handler) memorytest.Simulation[*wallets] {
	var workload []*ackwise.Message
	for i := range 30 {
		workload = append(workload, memorytest.Msg(fmt.Sprintf("dep-%d", i), fmt.Sprintf("wallet-%d", i%5), strconv.Itoa(10+i)))
	}
	return memorytest.Simulation[*wallets]{
		Workload:   workload,
		KeyOrdered: true, // one message per wallet at a time, in order
		Init: func(env *memorytest.SimEnv) *wallets {
			return &wallets{balance: map[string]int{}, lastSeen: map[string]string{}, inbox: meminbox.New(env.Clock())}
		},
		Setup: setup, // called again after each simulated crash
		Check: func(env *memorytest.SimEnv, w *wallets) error {
			want := map[string]int{}
			for _, m := range env.Messages() {
				if m.Outcome == memorytest.SimAcked {
					amount, _ := strconv.Atoi(string(m.Message.Payload))
					want[m.Key] += amount
				}
			}
			for wallet, sum := range want {
				if got := w.balance[wallet]; got != sum {
					return fmt.Errorf("%s holds %d, want %d", wallet, got, sum)
				}
			}
			return nil
		},
	}
}

// Each fault on its own: a crash, a lost ack, a duplicate, an outage of
// the fraud check whose retries go behind newer deposits (a reorder needs
// a message that goes back to the queue). The shortcut holds under every
// one.
func TestDepositsUnderSingleFaults(t *testing.T) {
	for _, faults := range []memorytest.FaultRates{
		{CrashBeforeAck: 0.1}, {CrashAfterAck: 0.1}, {LoseAck: 0.1}, {Duplicate: 0.1}, {Outage: 0.05, Reorder: 1},
	} {
		sim := depositsSim(deposit)
		sim.Faults = faults
		memorytest.Simulate(t, sim)
	}
}

// The fix: the inbox records every event ID handled, not just the last,
// with the effect.
func TestDepositsWithTheInbox(t *testing.T) {
	sim := depositsSim(func(env *memorytest.SimEnv, w *wallets) ackwise.Handler {
		inbox, err := middleware.Inbox(w.inbox, middleware.InboxConfig{Consumer: "wallets"})
		if err != nil {
			panic(err)
		}
		return ackwise.Chain(deposit(env, w), inbox)
	})
	sim.Seeds = 1000
	memorytest.Simulate(t, sim)
}

// docs/testing.md simulate: end

// TestDepositsUnderCombinedFaults: with every fault kind on (the default),
// Simulate finds what no single fault shows, and shrinks it to a lost ack
// (or a crash before the ack) and a reorder.
func TestDepositsUnderCombinedFaults(t *testing.T) {
	requireFound(t, depositsSim(deposit), 2, "reorder")
}
