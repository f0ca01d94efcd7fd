package sqs

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/adapters/adaptertest"
)

func TestConformanceStandard(t *testing.T) {
	t.Parallel()
	adaptertest.Run(t, harness(false))
}

func harness(fifo bool) adaptertest.Harness {
	return adaptertest.Harness{Open: func(t testing.TB, fc adaptertest.FixtureConfig) adaptertest.Fixture {
		c := testClient(t)
		conn := testConn(t)
		q := createQueue(t, c, "conformance", fc.Lease, fifo)
		dq := createQueue(t, c, "conformance-dlq", 0, fifo)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		sink, err := NewSink(ctx, SinkConfig{QueueURL: q, Connection: conn})
		if err != nil {
			t.Fatalf("sink: %v", err)
		}
		t.Cleanup(func() { sink.Close() })
		var mu sync.Mutex
		var dead []*ackwise.Message
		fix := newCountFix()
		return adaptertest.Fixture{
			Sink: sink,
			NewSource: func(t testing.TB) adapters.Source {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				// Short polling: local-aws-sqs holds the messages a long
				// poll picked until it has MaxNumberOfMessages or the wait
				// ends, their visibility timeout running, where AWS returns
				// them as soon as there are some (the source starts a
				// lease's clock at the response). A short poll holds them
				// 40 ms at most, within the source's margin of a tenth of
				// the lease.
				cfg := Config{QueueURL: q, DeadLetterQueueURL: dq, Connection: conn, WaitTime: -1}
				if fifo {
					cfg.Pollers = emulatorFIFOPollers
				}
				src, err := NewSource(ctx, cfg)
				if err != nil {
					t.Fatalf("source: %v", err)
				}
				t.Cleanup(func() { src.Close() })
				return fixedSource{src, fix}
			},
			DeadLetters: func(ctx context.Context, t testing.TB) []*ackwise.Message {
				mu.Lock()
				defer mu.Unlock()
				dead = append(dead, drain(ctx, t, c, dq)...)
				return append([]*ackwise.Message(nil), dead...)
			},
			// Over any queue's MaximumMessageSize: the sink refuses it
			// alone, before sending.
			Refuse: func(t testing.TB, msg *ackwise.Message) {
				msg.Payload = make([]byte, 2<<20)
			},
		}
	}}
}

func TestConformanceFIFO(t *testing.T) {
	t.Parallel()
	adaptertest.Run(t, harness(true))
}
