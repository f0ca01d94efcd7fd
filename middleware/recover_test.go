package middleware_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/ackwise/ackwise"
	"github.com/ackwise/ackwise/middleware"
)

func panicky(v any) ackwise.Handler {
	return ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { panic(v) })
}

func TestRecover(t *testing.T) {
	t.Parallel()
	msg := &ackwise.Message{ID: "e"}
	t.Run("DefaultIsPermanentWithBoundedStack", func(t *testing.T) {
		t.Parallel()
		err := middleware.Recover(middleware.RecoverConfig{})(panicky("nil map")).Handle(t.Context(), msg)
		var pe *middleware.PanicError
		if !errors.As(err, &pe) || pe.Value != "nil map" {
			t.Fatalf("got %v, want a *PanicError with the panic value", err)
		}
		if c := ackwise.ClassOf(err); c != ackwise.ClassPermanent {
			t.Fatalf("class %v, want permanent", c)
		}
		if len(pe.Stack) == 0 || len(pe.Stack) > middleware.DefaultMaxStack {
			t.Fatalf("stack of %d bytes, want 1..%d", len(pe.Stack), middleware.DefaultMaxStack)
		}
		if !strings.Contains(err.Error(), "handler panicked: nil map") || !strings.Contains(err.Error(), "goroutine") {
			t.Fatalf("error text %q lacks the value or the stack", err)
		}
	})
	t.Run("MarkAndMaxStack", func(t *testing.T) {
		t.Parallel()
		cfg := middleware.RecoverConfig{Mark: func(err error) error { return err }, MaxStack: -1}
		err := middleware.Recover(cfg)(panicky(io.ErrUnexpectedEOF)).Handle(t.Context(), msg)
		if c := ackwise.ClassOf(err); c != ackwise.ClassTransient {
			t.Fatalf("class %v, want transient", c)
		}
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("%v does not unwrap to the panic's error value", err)
		}
		var pe *middleware.PanicError
		if !errors.As(err, &pe) || pe.Stack != nil {
			t.Fatalf("MaxStack -1 kept a stack: %v", err)
		}
		cfg = middleware.RecoverConfig{MaxStack: 64}
		err = middleware.Recover(cfg)(panicky(1)).Handle(t.Context(), msg)
		if !errors.As(err, &pe) || len(pe.Stack) != 64 {
			t.Fatalf("MaxStack 64 kept %d bytes", len(pe.Stack))
		}
	})
	t.Run("PassesThrough", func(t *testing.T) {
		t.Parallel()
		boom := errors.New("boom")
		h := middleware.Recover(middleware.RecoverConfig{})(ackwise.HandlerFunc(func(context.Context, *ackwise.Message) error { return boom }))
		if err := h.Handle(t.Context(), msg); err != boom {
			t.Fatalf("got %v, want the handler's own error unchanged", err)
		}
	})
}

// TestRecoverMarkNilIsNotSuccess: a Mark that returns nil must not turn a
// panic into nil, which the engine would acknowledge.
func TestRecoverMarkNilIsNotSuccess(t *testing.T) {
	t.Parallel()
	cfg := middleware.RecoverConfig{Mark: func(error) error { return nil }}
	err := middleware.Recover(cfg)(panicky("boom")).Handle(t.Context(), &ackwise.Message{ID: "e"})
	var pe *middleware.PanicError
	if !errors.As(err, &pe) || pe.Value != "boom" {
		t.Fatalf("got %v, want the *PanicError (a panic is never a success)", err)
	}
}
