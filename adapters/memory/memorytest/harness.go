package memorytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/adaptertest"
	"github.com/ackwise/ackwise/adapters/memory"
)

var names atomic.Int64

// UniqueName returns a queue or topic name unique within the process,
// derived from the test's name.
func UniqueName(t testing.TB) string {
	n := strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
	return fmt.Sprintf("%s-%d", n, names.Add(1))
}

// QueueHarness connects the conformance suite to queues on b: each fixture is
// a fresh queue with the fixture's Lease and MaxAttempts (as MaxReceives),
// dead-lettering into "<queue>.dlq". Fixtures are deleted when the test ends.
func QueueHarness(b *memory.Broker) adaptertest.Harness {
	return adaptertest.Harness{Open: func(t testing.TB, cfg adaptertest.FixtureConfig) adaptertest.Fixture {
		t.Helper()
		name := UniqueName(t)
		if err := b.CreateQueue(name, memory.QueueConfig{Lease: cfg.Lease, MaxReceives: cfg.MaxAttempts}); err != nil {
			t.Fatalf("memorytest: %v", err)
		}
		return fixture(t, b, name, func(t testing.TB) (adapters.Source, error) { return b.QueueSource(name) })
	}}
}

// LogHarness connects the conformance suite to topics on b: each fixture is a
// fresh topic with the fixture's Partitions, consumed by one consumer group
// whose members NewSource adds, dead-lettering into "<topic>.dlq". A member
// joining the group is the fixture's Invalidate: it takes partitions from
// the others. Fixtures are deleted when the test ends.
func LogHarness(b *memory.Broker) adaptertest.Harness {
	return adaptertest.Harness{Open: func(t testing.TB, cfg adaptertest.FixtureConfig) adaptertest.Fixture {
		t.Helper()
		name := UniqueName(t)
		if err := b.CreateTopic(name, memory.TopicConfig{Partitions: cfg.Partitions}); err != nil {
			t.Fatalf("memorytest: %v", err)
		}
		f := fixture(t, b, name, func(t testing.TB) (adapters.Source, error) { return b.JoinGroup(name, "conformance") })
		f.Invalidate = func(t testing.TB, _ adapters.Source) { f.NewSource(t) }
		return f
	}}
}

func fixture(t testing.TB, b *memory.Broker, name string, open func(testing.TB) (adapters.Source, error)) adaptertest.Fixture {
	sink, err := b.Sink(name)
	if err != nil {
		t.Fatalf("memorytest: %v", err)
	}
	dlqName := name + memory.DeadLetterSuffix
	t.Cleanup(func() {
		b.Delete(name)
		b.Delete(dlqName)
	})
	return adaptertest.Fixture{
		Sink: sink,
		NewSource: func(t testing.TB) adapters.Source {
			t.Helper()
			src, err := open(t)
			if err != nil {
				t.Fatalf("memorytest: %v", err)
			}
			t.Cleanup(func() { src.Close() })
			return src
		},
		DeadLetters: func(ctx context.Context, t testing.TB) []*ackwise.Message {
			t.Helper()
			msgs, err := b.Messages(dlqName)
			if errors.Is(err, memory.ErrNotFound) {
				return nil
			}
			if err != nil {
				t.Fatalf("memorytest: %v", err)
			}
			return msgs
		},
		Refuse: func(t testing.TB, msg *ackwise.Message) {
			id := msg.ID
			Inject(t, b, name, memory.Fault{Kind: memory.FaultFailPublish, Err: ackwise.Permanent(errors.New("memorytest: refused")), Match: func(m *ackwise.Message) bool { return m.ID == id }})
		},
	}
}
