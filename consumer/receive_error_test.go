package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/adapters"
	"github.com/ackwise/ackwise/consumer"
)

// errAfterBatch returns its messages together with a receive error once.
type errAfterBatch struct {
	*fakeSource
	failed atomic.Bool
}

func (s *errAfterBatch) Receive(ctx context.Context, buf []*ackwise.Message) (int, error) {
	n, err := s.fakeSource.Receive(ctx, buf)
	if err == nil && n > 0 && s.failed.CompareAndSwap(false, true) {
		return n, errors.New("fetch: partial batch")
	}
	return n, err
}

// Coverage: a Receive returning n>0 with an error still hands the
// n messages to the handler, counts the error and keeps receiving.
func TestRegressionReceivePartialBatchWithError(t *testing.T) {
	t.Parallel()
	src := &errAfterBatch{fakeSource: newFakeSource(adapters.Capabilities{Delay: true}, msgs(3, 3)...)}
	c, err := consumer.New(src, ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return nil }), consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	run(t, c)
	if !src.waitSettled(3, 5*time.Second) {
		t.Fatal("batch returned with an error was not handled")
	}
	src.push(msgs(2, 2)...)
	if !src.waitSettled(5, 5*time.Second) {
		t.Fatal("receiving did not go on after the error")
	}
	// The engine counts an ack once the source took it: wait for the count.
	if !waitStats(c, 5*time.Second, func(st consumer.Stats) bool { return st.Acked == 5 }) || c.Stats().ReceiveErrors != 1 {
		t.Fatalf("stats %+v", c.Stats())
	}
}
