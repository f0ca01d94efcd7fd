package memorytest_test

import (
	"testing"

	"github.com/ackwise/ackwise/adapters/adaptertest"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
)

// The conformance suite (adaptertest) runs on both harnesses. Its cases
// wait for real leases and delays, so it uses a broker on the system clock.
func TestConformanceQueue(t *testing.T) {
	t.Parallel() // a broker of its own; the suite mostly waits
	b, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	adaptertest.Run(t, memorytest.QueueHarness(b))
}

func TestConformanceLog(t *testing.T) {
	t.Parallel()
	b, err := memory.New(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	adaptertest.Run(t, memorytest.LogHarness(b))
}
