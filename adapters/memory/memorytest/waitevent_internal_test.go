package memorytest

import (
	"context"
	"sync"
	"testing"

	"github.com/ackwise/ackwise/adapters/memory"
)

// The wait helpers follow a destination that is deleted and created again:
// its new history is shorter than what they had already scanned, and they
// must start over on it rather than slice past its end.
func TestWaitEventFollowsRecreatedDestination(t *testing.T) {
	t.Parallel()
	b, _ := NewBroker(t)
	for i := 0; i < 10; i++ {
		Publish(t, b, "q", Msg(string(rune('a'+i)), "", "p"))
	}
	first := make(chan struct{})
	var once sync.Once
	errc := make(chan error, 1)
	go func() {
		<-first // the helper scanned the old history and is waiting
		b.Delete("q")
		errc <- b.Publish(context.Background(), "q", Msg("x", "", "p"))
	}()
	e := waitEvent(t, b, "q", "publish of x", func(e memory.Event) bool {
		once.Do(func() { close(first) })
		return e.Kind == memory.EventPublished && e.ID == "x"
	})
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if e.ID != "x" || e.Kind != memory.EventPublished {
		t.Fatalf("got %v", e)
	}
}

// WaitForAckCount follows a recreated destination too: after a history of
// ten events it is shown the new, shorter one and counts its acks instead
// of slicing past its end (a panic under the broker's lock).
func TestAckCounterFollowsRecreatedDestination(t *testing.T) {
	t.Parallel()
	old := make([]memory.Event, 10)
	for i := range old {
		old[i] = memory.Event{Kind: memory.EventPublished}
	}
	done := ackCounter(1)
	if done(old) {
		t.Fatal("done without an ack")
	}
	recreated := []memory.Event{{Kind: memory.EventPublished}, {Kind: memory.EventDelivered}, {Kind: memory.EventAcked}}
	if !done(recreated) {
		t.Fatal("the new history's ack was not counted")
	}
}
