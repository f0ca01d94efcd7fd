package kafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
)

// TestShareExtendLeaseAfterClose: the engine's heartbeat outlives Run for
// handlers still running after its drain deadline, and the application may
// close the source meanwhile. Closing released the records not settled, so
// ExtendLease reports the source closed (which the heartbeat keeps quiet
// about). Before, it queued a renewal on the closed client and reported
// success.
func TestShareExtendLeaseAfterClose(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, newCluster(t), 1)
	publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
	src := openShare(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	buf := make([]*ackwise.Message, 1)
	if n, err := src.Receive(ctx, buf); n != 1 || err != nil {
		t.Fatalf("Receive = %d, %v", n, err)
	}
	if err := src.ExtendLease(ctx, buf[0], time.Second); err != nil {
		t.Fatalf("ExtendLease while open: %v", err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if err := src.ExtendLease(ctx, buf[0], time.Second); !errors.Is(err, adapters.ErrClosed) {
		t.Fatalf("ExtendLease after Close = %v, want adapters.ErrClosed", err)
	}
}

// TestCloseEndsWaitInPlace: a source closed under a running engine tells it
// (adapters.Invalidator), so the record whose retry waits in place for an
// hour goes back at once; its MaxInFlight slot is free, the engine's
// Receive learns of the close and Run ends. Without it Run would wait the
// hour, its Receive held back by the full slot. For the share source and
// the consumer-group source.
func TestCloseEndsWaitInPlace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		open func(*testing.T, SourceConfig) adapters.Source
	}{
		{"share", func(t *testing.T, cfg SourceConfig) adapters.Source { return openShare(t, cfg) }},
		{"group", func(t *testing.T, cfg SourceConfig) adapters.Source { return openSource(t, cfg) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t, newCluster(t), 1)
			publishN(t, openSink(t, cfg), 1, func(int) string { return "k" })
			src := tc.open(t, cfg)
			h := ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error {
				return ackwise.RetryAfter(errors.New("429"), time.Hour)
			})
			log := make(outcomeLog, 4)
			cons, err := consumer.New(src, h, consumer.Config{Concurrency: 1, MaxInFlight: 1, Observer: log})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- cons.Run(ctx) }()
			if o := awaitOutcome(t, log); o != consumer.Retried {
				t.Fatalf("outcome %v, want retried", o)
			}
			if err := src.Close(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if !errors.Is(err, adapters.ErrClosed) {
					t.Fatalf("Run = %v, want adapters.ErrClosed", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatalf("Run still waits 15s after Close; stats %+v", cons.Stats())
			}
			if st := cons.Stats(); st.InFlight != 0 || st.Retried != 1 || st.Acked+st.DeadLettered != 0 {
				t.Fatalf("stats %+v: want the record handed back unsettled", st)
			}
		})
	}
}
