package memory_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/memory"
	"github.com/ackwise/ackwise/adapters/memory/memorytest"
)

type testBundle struct {
	b   *memory.Broker
	clk *memory.VirtualClock
	ctx context.Context
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	clk := memory.NewVirtualClock(time.Time{})
	b, err := memory.New(memory.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{b: b, clk: clk, ctx: context.Background()}
}

func (tb *testBundle) queue(t *testing.T, name string, cfg memory.QueueConfig) *memory.QueueSource {
	t.Helper()
	if err := tb.b.CreateQueue(name, cfg); err != nil {
		t.Fatal(err)
	}
	src, err := tb.b.QueueSource(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

func (tb *testBundle) member(t *testing.T, topic, group string) *memory.GroupSource {
	t.Helper()
	src, err := tb.b.JoinGroup(topic, group)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

func (tb *testBundle) publish(t *testing.T, dest string, msgs ...*ackwise.Message) {
	t.Helper()
	memorytest.Publish(t, tb.b, dest, msgs...)
}

func recv(t *testing.T, src adapters.Source, n int) []*ackwise.Message {
	t.Helper()
	return memorytest.Receive(t, src, n)
}

// recvOne receives exactly one message with a buffer of one.
func recvOne(t *testing.T, src adapters.Source) *ackwise.Message {
	t.Helper()
	return recv(t, src, 1)[0]
}

// requireNothing asserts that Receive has nothing to deliver: no message is
// there to signal, so it waits a short real-time moment for the absence.
func requireNothing(t *testing.T, src adapters.Source) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	buf := make([]*ackwise.Message, 8)
	n, err := src.Receive(ctx, buf)
	if n > 0 || !errors.Is(err, context.DeadlineExceeded) {
		ids := []string{}
		for _, m := range buf[:n] {
			ids = append(ids, m.ID)
		}
		t.Fatalf("Receive = %d %q, %v; want nothing", n, ids, err)
	}
}

func ids(msgs []*ackwise.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

func msg(id, key string) *ackwise.Message { return memorytest.Msg(id, key, "payload-"+id) }

func mustStats(t *testing.T, b *memory.Broker, name string) memory.Stats {
	t.Helper()
	st, err := b.Stats(name)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func runtimeGosched() { runtime.Gosched() }
