package memory_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters/memory"
)

var _ ackwise.Clock = (*memory.VirtualClock)(nil)

func TestVirtualClock(t *testing.T) {
	t.Parallel()
	clk := memory.NewVirtualClock(time.Time{})
	if !clk.Now().Equal(memory.VirtualStart) {
		t.Fatalf("Now = %v", clk.Now())
	}
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clk = memory.NewVirtualClock(start)

	fired := make(chan string, 3)
	clk.AfterFunc(10*time.Minute, func() { fired <- "10m" })
	stop := clk.AfterFunc(time.Minute, func() { fired <- "1m-stopped" })
	clk.AfterFunc(2*time.Minute, func() { fired <- "2m" })
	if p := clk.Pending(); p != 3 {
		t.Fatalf("Pending = %d", p)
	}
	if !stop.Stop() {
		t.Fatal("Stop of pending timer = false")
	}
	if stop.Stop() {
		t.Fatal("second Stop = true")
	}
	if p := clk.Pending(); p != 2 {
		t.Fatalf("Pending after Stop = %d", p)
	}
	clk.Advance(2 * time.Minute)
	if got := <-fired; got != "2m" {
		t.Fatalf("fired %q", got)
	}
	if p := clk.Pending(); p != 1 {
		t.Fatalf("Pending after Advance = %d", p)
	}
	if !clk.Now().Equal(start.Add(2 * time.Minute)) {
		t.Fatalf("Now = %v", clk.Now())
	}
	clk.Advance(-time.Hour) // ignored
	clk.Advance(8 * time.Minute)
	if got := <-fired; got != "10m" {
		t.Fatalf("fired %q", got)
	}
	select {
	case got := <-fired:
		t.Fatalf("stopped timer fired: %q", got)
	default:
	}

	var n atomic.Int32
	clk.AfterFunc(0, func() { n.Add(1); fired <- "now" })
	if got := <-fired; got != "now" || clk.Pending() != 0 {
		t.Fatalf("zero-duration timer: %q, pending %d", got, clk.Pending())
	}
}

func TestVirtualClockWaitForTimers(t *testing.T) {
	t.Parallel()
	clk := memory.NewVirtualClock(time.Time{})
	done := make(chan error, 1)
	go func() { done <- clk.WaitForTimers(context.Background(), 2) }()
	clk.AfterFunc(time.Second, func() {})
	clk.AfterFunc(time.Hour, func() {})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := clk.WaitForTimers(ctx, 3); err != context.Canceled {
		t.Fatalf("WaitForTimers with cancelled ctx = %v", err)
	}
}

// The pattern the engine's tests use: wait until the code under test
// scheduled its timer, then advance past it.
func TestVirtualClockRetryPattern(t *testing.T) {
	t.Parallel()
	clk := memory.NewVirtualClock(time.Time{})
	retried := make(chan time.Time, 1)
	go func() {
		clk.AfterFunc(10*time.Minute, func() { retried <- clk.Now() })
	}()
	if err := clk.WaitForTimers(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Minute)
	if at := <-retried; !at.Equal(memory.VirtualStart.Add(10 * time.Minute)) {
		t.Fatalf("retried at %v", at)
	}
}

// TestVirtualClockWaitForTimer: WaitForTimer waits for a timer that fires d
// or more from now, whatever shorter timers are pending (a heartbeat), and
// measures from the clock's current time.
func TestVirtualClockWaitForTimer(t *testing.T) {
	t.Parallel()
	clk := memory.NewVirtualClock(time.Time{})
	heartbeat := clk.AfterFunc(10*time.Second, func() {})
	defer heartbeat.Stop()
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := clk.WaitForTimers(short, 1); err != nil {
		t.Fatalf("WaitForTimers(1) = %v: the heartbeat alone satisfies a count", err)
	}
	if err := clk.WaitForTimer(short, time.Hour); err != context.DeadlineExceeded {
		t.Fatalf("WaitForTimer(1h) with only a 10s timer pending = %v, want it to block", err)
	}

	ctx, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	armed := make(chan struct{})
	go func() {
		<-armed
		clk.AfterFunc(time.Hour, func() {})
	}()
	done := make(chan error, 1)
	go func() { done <- clk.WaitForTimer(ctx, time.Hour) }()
	close(armed)
	if err := <-done; err != nil {
		t.Fatalf("WaitForTimer(1h) = %v after a 1h timer was armed", err)
	}

	// Half an hour later the timer fires in 30m: it is not one of 1h any
	// more, but is one of 30m.
	clk.Advance(30 * time.Minute)
	short2, cancel3 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel3()
	if err := clk.WaitForTimer(short2, time.Hour); err != context.DeadlineExceeded {
		t.Fatalf("WaitForTimer(1h) 30m after arming = %v, want it to block", err)
	}
	if err := clk.WaitForTimer(ctx, 30*time.Minute); err != nil {
		t.Fatalf("WaitForTimer(30m) = %v", err)
	}
}
