package memorytest_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
	"github.com/ackwise/ackwise/consumer"
)

// TestChargeIsRetriedAndSurvivesALostAck is the virtual-clock example of
// docs/testing.md, which TestTestingDocShowsTheExample keeps equal to it.
//
// docs/testing.md: begin
func TestChargeIsRetriedAndSurvivesALostAck(t *testing.T) {
	b, clk := memorytest.NewBroker(t) // history on, time moves only on Advance
	// A lease longer than the retry: no delivery expires while it waits.
	if err := b.CreateQueue("orders", memory.QueueConfig{Lease: 2 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	// A fault needs its queue: inject it after CreateQueue (or a Publish).
	memorytest.Inject(t, b, "orders", memory.Fault{Kind: memory.FaultLoseAck, Count: 1})
	memorytest.Publish(t, b, "orders", memorytest.Msg("evt-1", "cust-7", `{"cents": 4200}`))

	var calls atomic.Int32
	charge := ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) error {
		if calls.Add(1) == 1 {
			return ackwise.RetryAfter(errors.New("card processor: 429"), time.Hour)
		}
		return nil // charged
	})
	src, err := b.QueueSource("orders")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	c, err := consumer.New(src, charge, consumer.Config{
		Clock:     clk, // the engine's retry timers and lease heartbeat run on it
		RetryMode: consumer.RetryInPlace,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { stop(); <-done }()

	// The retry waits in place for an hour. The engine's lease heartbeat
	// arms timers on the clock too, so how many are pending depends on
	// scheduling: wait for the hour-long timer itself, not for a count.
	memorytest.WaitForTimer(t, clk, time.Hour)
	clk.Advance(time.Hour)

	// The second try charges; its ack is lost (the fault).
	memorytest.WaitFor(t, b, "orders", "the lost ack", func(evs []memory.Event) bool {
		for _, e := range evs {
			if e.Kind == memory.EventFault {
				return true
			}
		}
		return false
	})
	// Past the lease the broker delivers the message again: at least once.
	clk.Advance(3 * time.Hour)
	memorytest.WaitForAcked(t, b, "orders", "evt-1")
	memorytest.RequireDeliveries(t, b, "orders", "evt-1", 2)
	if n := calls.Load(); n != 3 {
		t.Fatalf("handler ran %d times, want 3 (a retry, then a redelivery)", n)
	}
	// Charged twice: an idempotency inbox (middleware.Inbox) absorbs that.
}

// docs/testing.md: end

// TestTestingDocShowsTheExample: docs/testing.md shows the example above
// as it is, so that the page cannot drift from code that runs.
func TestTestingDocShowsTheExample(t *testing.T) {
	t.Parallel()
	requireDocShows(t, "example_test.go", "docs/testing.md")
}

// TestTestingDocShowsTheSimulation: docs/testing.md shows the simulation
// walk-through of simulate_doc_test.go as it is.
func TestTestingDocShowsTheSimulation(t *testing.T) {
	t.Parallel()
	requireDocShows(t, "simulate_doc_test.go", "docs/testing.md simulate")
}

// requireDocShows fails t unless docs/testing.md holds, as a Go code block,
// the code of file between the comments "// <marker>: begin" and
// "// <marker>: end".
func requireDocShows(t *testing.T, file, marker string) {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "testing.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, code, ok := strings.Cut(string(src), "// "+marker+": begin\n")
	code, _, ok2 := strings.Cut(code, "\n// "+marker+": end")
	if !ok || !ok2 {
		t.Fatalf("%s lacks its %s markers", file, marker)
	}
	block := "```go\n" + strings.TrimRight(code, "\n") + "\n```\n"
	if !strings.Contains(string(doc), block) {
		t.Fatalf("docs/testing.md does not show the code of %s as it is; copy it:\n%s", file, block)
	}
}
