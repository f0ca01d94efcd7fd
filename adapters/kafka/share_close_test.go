package kafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
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
