package middleware_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
)

// waitCtx blocks until its context ends and returns the context's error.
var waitCtx = ackwise.HandlerFunc(func(ctx context.Context, _ *ackwise.Message) error {
	<-ctx.Done()
	return ctx.Err()
})

func TestTimeout(t *testing.T) {
	t.Parallel()
	msg := &ackwise.Message{}
	t.Run("Fires", func(t *testing.T) {
		t.Parallel()
		err := middleware.Timeout(10*time.Millisecond)(waitCtx).Handle(t.Context(), msg)
		if !errors.Is(err, middleware.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want ErrTimeout wrapping DeadlineExceeded", err)
		}
		if c := ackwise.ClassOf(err); c != ackwise.ClassTransient {
			t.Fatalf("class %v, want transient", c)
		}
		if ackwise.IsShutdown(t.Context(), err) {
			t.Fatal("a handler timeout looks like a shutdown")
		}
	})
	t.Run("ParentCancelIsNotATimeout", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		err := middleware.Timeout(time.Hour)(waitCtx).Handle(ctx, msg)
		if errors.Is(err, middleware.ErrTimeout) || !ackwise.IsShutdown(ctx, err) {
			t.Fatalf("got %v, want the parent's cancellation, seen as a shutdown", err)
		}
	})
	t.Run("ZeroDisables", func(t *testing.T) {
		t.Parallel()
		h := middleware.Timeout(0)(ackwise.HandlerFunc(func(ctx context.Context, _ *ackwise.Message) error {
			if _, ok := ctx.Deadline(); ok {
				return errors.New("deadline set")
			}
			return nil
		}))
		if err := h.Handle(t.Context(), msg); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("SuccessUnchanged", func(t *testing.T) {
		t.Parallel()
		h := middleware.Timeout(time.Hour)(ackwise.HandlerFunc(func(ctx context.Context, _ *ackwise.Message) error {
			if dl, ok := ctx.Deadline(); !ok || time.Until(dl) < 59*time.Minute {
				return errors.New("deadline not set to an hour")
			}
			return nil
		}))
		if err := h.Handle(t.Context(), msg); err != nil {
			t.Fatal(err)
		}
	})
}
