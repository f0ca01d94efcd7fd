package consumer_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
	"github.com/ackwise/ackwise/retry"
)

// TestStallWatchTakesRanStress: handlers of fast batches now and then block
// past the stall watch's period, so the watch acks and finishes the messages
// their worker ran before, concurrently with the worker, with recycling, the
// heartbeat, in-place retries, ordering and an Observer. Every message must
// be settled exactly once, never touched after its recycling, and the keys
// kept in order.
func TestStallWatchTakesRanStress(t *testing.T) {
	for _, pace := range paces {
		t.Run(pace, func(t *testing.T) {
			const n = 1500
			src := newReuseSource(t, adapters.Capabilities{Delay: true, Lease: 9 * time.Millisecond, ExtendLease: true}, n)
			var calls atomic.Int64
			var mu sync.Mutex
			running := map[string]bool{}
			h := ackwise.HandlerFunc(func(ctx context.Context, m *ackwise.Message) error {
				mu.Lock()
				if running[m.Key] {
					t.Errorf("two messages of key %s at once", m.Key)
				}
				running[m.Key] = true
				mu.Unlock()
				defer func() {
					mu.Lock()
					running[m.Key] = false
					mu.Unlock()
				}()
				c := calls.Add(1)
				switch {
				case c%97 == 0:
					time.Sleep(6 * time.Millisecond) // past the stall watch
				case c%13 == 0:
					return errors.New("transient")
				}
				return nil
			})
			c := newPaced(t, src, h, consumer.Config{Concurrency: 3, MaxInFlight: 48, ReceiveBatch: 48, Ordering: consumer.OrderKey, RetryMode: consumer.RetryInPlace, Observer: obs{src},
				Retry: retry.Policy{MaxAttempts: 3, InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond}}, pace)
			stop := run(t, c)
			deadline := time.Now().Add(30 * time.Second)
			for src.acks.Load()+src.dead.Load() < n {
				if time.Now().After(deadline) {
					t.Fatalf("stuck: %+v", c.Stats())
				}
				time.Sleep(time.Millisecond)
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if got := src.acks.Load() + src.dead.Load(); got != n {
				t.Fatalf("%d settled, want %d", got, n)
			}
		})
	}
}
