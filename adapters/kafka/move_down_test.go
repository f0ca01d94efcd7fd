package kafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/dlq"
)

// TestMoveReturnsWhenBrokerDown: Nack and DeadLetter return ctx's error when
// ctx ends before the broker confirmed the move, as Sink.Publish does. With
// ProduceSync they blocked for as long as franz-go retried the idempotent
// produce (for ever), whatever ctx said.
func TestMoveReturnsWhenBrokerDown(t *testing.T) {
	t.Parallel()
	for name, move := range map[string]func(context.Context, *Source, *ackwise.Message) error{
		"Nack": func(ctx context.Context, s *Source, m *ackwise.Message) error { return s.Nack(ctx, m, time.Second) },
		"DeadLetter": func(ctx context.Context, s *Source, m *ackwise.Message) error {
			return s.DeadLetter(ctx, m, dlq.Envelope{})
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(t, c.ListenAddrs(), 1, time.Minute)
			publishN(t, openSink(t, cfg), 2, func(int) string { return "k" })
			ctx0, cancel0 := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel0()
			src, err := NewSource(ctx0, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(src.Client().Close) // not src.Close: it commits to a broker that is gone
			ms := receiveN(t, src, 2)
			if err := move(ctx0, src, ms[0]); err != nil { // the producer ID is loaded, a batch sent
				t.Fatal(err)
			}
			c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- move(ctx, src, ms[1]) }()
			select {
			case err := <-done:
				if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
					t.Errorf("%s to a broker that is gone = %v, want the context's deadline", name, err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("%s to a broker that is gone, with a 1s context, still blocked after 15s", name)
			}
		})
	}
}
