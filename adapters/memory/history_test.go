package memory_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise/adapters/memory"
)

// WaitHistory on a name that is deleted and created again goes on with the
// new destination's history instead of waiting on the dead one forever.
func TestWaitHistoryFollowsRecreatedDestination(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	tb.publish(t, "q", msg("old", ""))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	first := make(chan struct{})
	var once atomic.Bool
	done := make(chan error, 1)
	go func() {
		done <- tb.b.WaitHistory(ctx, "q", func(evs []memory.Event) bool {
			if once.CompareAndSwap(false, true) {
				close(first) // the waiter registers under the same lock
			}
			for _, e := range evs {
				if e.Kind == memory.EventPublished && e.ID == "new" {
					return true
				}
			}
			return false
		})
	}()
	<-first
	tb.b.Delete("q")
	if err := tb.b.CreateQueue("q", memory.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	tb.publish(t, "q", msg("new", ""))
	if err := <-done; err != nil {
		t.Fatalf("WaitHistory = %v; it kept waiting on the deleted queue", err)
	}
}
