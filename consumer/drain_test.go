package consumer_test

import (
	"math"
	"testing"
	"time"

	"github.com/ackwise/ackwise/consumer"
)

func TestEstimateDrain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                  string
		b0, b1, consumed      int64
		window                time.Duration
		want                  time.Duration
		wantConsume, wantIngr float64
	}{
		// The seed's example: 6M queued, 10,000/s consumed, 8,000/s
		// arriving: net 2,000/s, 3,000s to drain.
		{"seed example", 6_000_000 + 2_000*60, 6_000_000, 10_000 * 60, time.Minute, 3000 * time.Second, 10_000, 8_000},
		{"growing", 100, 160, 60, time.Minute, consumer.NotDraining, 1, 2},
		{"steady", 100, 100, 600, time.Minute, consumer.NotDraining, 10, 10},
		{"empty", 50, 0, 50, 10 * time.Second, 0, 5, 0},
		{"empty and idle", 0, 0, 0, 10 * time.Second, 0, 0, 0},
		{"no ingress", 1000, 500, 500, 10 * time.Second, 10 * time.Second, 50, 0},
		// Counts taken apart are not exact: a shrink larger than what was
		// consumed (another instance consumed too) gives no negative ingress.
		{"other consumers", 1000, 500, 100, 10 * time.Second, 10 * time.Second, 10, 0},
		{"zero window", 10, 5, 5, 0, consumer.NotDraining, 0, 0},
		{"negative window", 10, 5, 5, -time.Second, consumer.NotDraining, 0, 0},
		{"negative backlog", -1, 5, 5, time.Second, consumer.NotDraining, 0, 0},
		{"negative consumed", 10, 5, -5, time.Second, consumer.NotDraining, 0, 0},
		{"huge backlog, slow drain", math.MaxInt64, math.MaxInt64 - 1, 1, time.Hour, time.Duration(math.MaxInt64), 1.0 / 3600, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := consumer.EstimateDrain(tc.b0, tc.b1, tc.consumed, tc.window)
			if d.Time != tc.want {
				t.Errorf("Time = %v, want %v", d.Time, tc.want)
			}
			if d.Draining() != (tc.want != consumer.NotDraining) {
				t.Errorf("Draining() = %v with Time %v", d.Draining(), d.Time)
			}
			if !near(d.ConsumeRate, tc.wantConsume) || !near(d.IngressRate, tc.wantIngr) {
				t.Errorf("rates consume %v ingress %v, want %v %v", d.ConsumeRate, d.IngressRate, tc.wantConsume, tc.wantIngr)
			}
		})
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(b)) }
