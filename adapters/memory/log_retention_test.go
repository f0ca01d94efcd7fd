package memory_test

import (
	"testing"

	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
)

// When retention dropped records a group had not read and nothing of the
// group is in progress, the committed offset jumps to the oldest retained
// record: that move is a commit like any other and is recorded as one
// (memorytest.WaitForCommitted waits on it).
func TestLogRetentionSkipRecordsCommit(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	if err := tb.b.CreateTopic("ev", memory.TopicConfig{Retention: 3}); err != nil {
		t.Fatal(err)
	}
	src := tb.member(t, "ev", "g") // the group starts at offset 0
	for i := range 10 {
		tb.publish(t, "ev", msg(string(rune('a'+i)), ""))
	}
	if m := recvOne(t, src); m.Offset != 7 {
		t.Fatalf("first record after retention at offset %d, want 7", m.Offset)
	}
	memorytest.RequireCommitted(t, tb.b, "ev", "g", 0, 7)
	evs, err := tb.b.History("ev")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs {
		if e.Kind == memory.EventCommitted && e.Group == "g" && e.Partition == 0 && e.Offset == 7 {
			found = true
		}
	}
	if !found {
		t.Fatal("the committed offset moved to 7 without a committed event")
	}
}
