package consumer

// Test hooks: the hand-off pace.

var paceNames = [...]string{modeSingle: "single", modeBatch: "batch", modeInline: "inline"}

// PinPace fixes c's hand-off pace ("single", "batch" or "inline") for the
// tests of each hand-off. Call it before Run.
func PinPace(c *Consumer, name string) {
	for m, n := range paceNames {
		if n == name {
			c.pace.fixed = true
			c.pace.mode.Store(int32(m))
			return
		}
	}
	panic("unknown pace " + name)
}

// PaceOf returns c's current hand-off pace.
func PaceOf(c *Consumer) string { return paceNames[c.pace.mode.Load()] }

// Drained returns the channel Run closes once its drain has begun and no
// message is in flight. Call it while Run is running.
func Drained(c *Consumer) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.drained
}

// FailedSettles is how many messages c remembers as having failed to settle
// (their redeliveries wait).
func FailedSettles(c *Consumer) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.holds.failed)
}

// Stopping reports whether c's Run has begun its drain.
func Stopping(c *Consumer) bool { return c.stopping.Load() }

// MaxInFlightOf is c's MaxInFlight, defaults applied.
func MaxInFlightOf(c *Consumer) int { return c.cfg.MaxInFlight }

// StallWatchParked reports whether the stall watch has no worker to look
// at (no worker runs a chunk of several tasks), so that nothing wakes it.
func StallWatchParked(c *Consumer) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.pool.workers {
		if w.watched.Load() {
			return false
		}
	}
	return true
}

// StallWatchWakes is how many times the stall watch woke up in c's Runs.
func StallWatchWakes(c *Consumer) uint64 { return c.pool.watchWakes.Load() }
