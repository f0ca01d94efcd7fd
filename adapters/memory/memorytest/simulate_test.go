package memorytest_test

import (
	"context"
	"fmt"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/middleware"
	"github.com/ackwise/ackwise/middleware/meminbox"
)

// orders is the workload of the seed scenario (shared/seeds/000): ten
// orders, m1 to m10, each to be charged once.
func orders() []*ackwise.Message {
	msgs := make([]*ackwise.Message, 10)
	for i := range msgs {
		msgs[i] = memorytest.Msg(fmt.Sprintf("m%d", i+1), fmt.Sprintf("order-%d", 101+i), "charge")
	}
	return msgs
}

// shop is the durable state of the charge scenario: the charges made, and
// the inbox when the handler uses one.
type shop struct {
	mu      sync.Mutex
	charges map[string]int
	inbox   *meminbox.Store
}

func (s *shop) charge(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.charges[id]++
}

func newShop(env *memorytest.SimEnv) *shop {
	return &shop{charges: map[string]int{}, inbox: meminbox.New(env.Clock())}
}

// chargedOnce is the invariant: every order acked is charged exactly once;
// one dead-lettered (a person will look at it) at most once.
func chargedOnce(env *memorytest.SimEnv, s *shop) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range env.Messages() {
		n := s.charges[m.ID]
		switch {
		case m.Outcome == memorytest.SimAcked && n == 0:
			return fmt.Errorf("%s was acked but never charged (lost)", m.ID)
		case n > 1:
			return fmt.Errorf("%s was charged %d times", m.ID, n)
		}
	}
	return nil
}

// chargeThenAck charges, then returns nil: the engine acks after the work.
func chargeThenAck(env *memorytest.SimEnv, s *shop) ackwise.Handler {
	return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		if err := env.Call(ctx, "card-check", func() error { return nil }); err != nil {
			return err // the card processor is down: retried
		}
		s.charge(msg.ID)
		return nil
	})
}

// ackFirst returns nil at once and charges a moment later, from memory: the
// "ack first, then work" consumer.
func ackFirst(env *memorytest.SimEnv, s *shop) ackwise.Handler {
	return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		id := msg.ID
		env.Clock().AfterFunc(5*time.Millisecond, func() { s.charge(id) })
		return nil
	})
}

// withInbox is chargeThenAck behind the idempotency inbox.
func withInbox(env *memorytest.SimEnv, s *shop) ackwise.Handler {
	inbox, err := middleware.Inbox(s.inbox, middleware.InboxConfig{Consumer: "billing"})
	if err != nil {
		panic(err)
	}
	return ackwise.Chain(chargeThenAck(env, s), inbox)
}

// simulateFailure runs Simulate and returns the message it failed the test
// with, or "" when it passed.
func simulateFailure[S any](t *testing.T, sim memorytest.Simulation[S]) string {
	t.Helper()
	r := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		memorytest.Simulate(r, sim)
	}()
	<-done
	return r.msg
}

// fatalRecorder records Simulate's failure instead of failing the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Fatal(args ...any) {
	r.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.Fatal(fmt.Sprintf(format, args...))
}

func (r *fatalRecorder) Logf(string, ...any) {}

var shrunkRE = regexp.MustCompile(`to (\d+) fault\(s\)`)

// shrunkFaults returns the size of the shrunk schedule in a failure message.
func shrunkFaults(t *testing.T, msg string) int {
	t.Helper()
	m := shrunkRE.FindStringSubmatch(msg)
	if m == nil {
		t.Fatalf("no shrunk schedule in:\n%s", msg)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// crashesOnly are the faults of the seed scenario: the consumer crashes,
// between charge and ack or just after the ack.
var crashesOnly = memorytest.FaultRates{CrashBeforeAck: 0.05, CrashAfterAck: 0.05}

// The seed scenario (shared/seeds/000) with the engine's order: charge,
// then ack. A crash between the two charges the order twice.
func TestSimulateFindsTheDoubleChargeOfAckAfterWork(t *testing.T) {
	t.Parallel()
	start := time.Now()
	msg := simulateFailure(t, memorytest.Simulation[*shop]{
		Workload: orders(),
		Init:     newShop,
		Setup:    chargeThenAck,
		Check:    chargedOnce,
		Seeds:    1000,
		Faults:   crashesOnly,
	})
	took := time.Since(start)
	if !strings.Contains(msg, "charged 2 times") {
		t.Fatalf("the double charge was not found; got %q", msg)
	}
	if n := shrunkFaults(t, msg); n != 1 || !strings.Contains(msg, "1. crash-before-ack on") {
		t.Errorf("shrunk to %d faults, want the one crash before the ack:\n%s", n, msg)
	}
	if took > time.Second {
		t.Errorf("found in %v, want under 1s", took)
	}
	t.Logf("found and shrunk in %v:\n%s", took, msg)
}

// The seed scenario with the order reversed: ack (return nil), then charge
// from memory. A crash after the ack loses the charge.
func TestSimulateFindsTheLossOfAckFirst(t *testing.T) {
	t.Parallel()
	start := time.Now()
	msg := simulateFailure(t, memorytest.Simulation[*shop]{
		Workload: orders(),
		Init:     newShop,
		Setup:    ackFirst,
		Check:    chargedOnce,
		Seeds:    1000,
		Faults:   crashesOnly,
	})
	took := time.Since(start)
	if !strings.Contains(msg, "never charged (lost)") {
		t.Fatalf("the loss was not found; got %q", msg)
	}
	if n := shrunkFaults(t, msg); n != 1 || !strings.Contains(msg, "1. crash-after-ack on") {
		t.Errorf("shrunk to %d faults, want the one crash after the ack:\n%s", n, msg)
	}
	if took > time.Second {
		t.Errorf("found in %v, want under 1s", took)
	}
	t.Logf("found and shrunk in %v:\n%s", took, msg)
}

func TestSimulateInboxPasses1000Seeds(t *testing.T) {
	t.Parallel()
	for _, mode := range []memorytest.SimMode{memorytest.SimQueue, memorytest.SimLog} {
		t.Run(mode.String(), func(t *testing.T) {
			memorytest.Simulate(t, memorytest.Simulation[*shop]{
				Workload: orders(),
				Init:     newShop,
				Setup:    withInbox,
				Check:    chargedOnce,
				Seeds:    1000,
				Mode:     mode,
				// Every fault but a lost reply: the inbox cannot undo an
				// effect a dependency made before its reply was lost
				// (IdempotencyKey is for that).
				Faults: memorytest.FaultRates{CrashBeforeAck: 0.05, CrashAfterAck: 0.05, LoseAck: 0.05, Duplicate: 0.1, Reorder: 0.3, Rebalance: 0.05, Outage: 0.03},
			})
		})
	}
}
