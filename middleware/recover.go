package middleware

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/ackwise/ackwise"
)

// DefaultMaxStack is the default number of bytes of the goroutine stack that
// a [PanicError] keeps.
const DefaultMaxStack = 4096

// RecoverConfig configures [Recover]. The zero value means the documented
// defaults.
type RecoverConfig struct {
	// Mark classifies the error a panic becomes. Nil means [ackwise.Permanent]:
	// a handler that panics on a message will most likely panic on it again,
	// so the message goes to the dead-letter destination at once. Pass
	// func(err error) error { return err } to retry panics as transient
	// failures. A Mark that returns nil is ignored (the unmarked
	// *PanicError is returned): a panic never becomes a success. The
	// *PanicError unwraps to the panic value when that is an error, so a
	// Mark that adds no class of its own (the identity above, or nil) leaves
	// the class of such a value in force: a panic(ackwise.Discard(err)) is
	// then discarded, not retried. Pass a Mark that classifies explicitly
	// where handlers may panic with classified errors.
	Mark func(err error) error
	// MaxStack bounds the bytes of stack trace kept in the error (and so in
	// its text, which travels in the ackwise-dlq-error header). Zero means
	// DefaultMaxStack; -1 keeps no stack.
	MaxStack int
}

// PanicError is the error a recovered panic becomes. It unwraps to the
// panic value when that value is an error, so errors.Is/As see through it.
type PanicError struct {
	// Value is the value passed to panic.
	Value any
	// Stack is the panicking goroutine's stack, cut to RecoverConfig.MaxStack
	// bytes.
	Stack []byte
}

// Error returns "middleware: handler panicked: <value>" followed by the
// bounded stack.
func (e *PanicError) Error() string {
	if len(e.Stack) == 0 {
		return fmt.Sprintf("middleware: handler panicked: %v", e.Value)
	}
	return fmt.Sprintf("middleware: handler panicked: %v\n%s", e.Value, e.Stack)
}

// Unwrap returns the panic value if it is an error, else nil.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// Recover returns middleware that turns a panic in the handler into a
// [*PanicError], marked by cfg.Mark (permanent by default), instead of
// crashing the process. It recovers only panics on the goroutine that calls
// the handler; a handler that starts goroutines recovers those itself.
// runtime.Goexit is not a panic and is not recovered.
//
// The consumer engine (package consumer) recovers handler panics itself,
// outside the inbox, classifies them by consumer.Config.RetryPanics and
// counts them in its Stats; it does not need Recover. Recover is for
// pipelines the engine does not run. Put in consumer.Config.Middleware it
// still works (the inbox sees an error and rolls back), but it takes the
// panic from the engine: cfg.Mark decides the class instead of RetryPanics,
// and the engine no longer counts the panic.
func Recover(cfg RecoverConfig) ackwise.Middleware {
	mark := cfg.Mark
	if mark == nil {
		mark = ackwise.Permanent
	}
	maxStack := cfg.MaxStack
	if maxStack == 0 {
		maxStack = DefaultMaxStack
	}
	return func(next ackwise.Handler) ackwise.Handler {
		return ackwise.HandlerFunc(func(ctx context.Context, msg *ackwise.Message) (err error) {
			defer func() {
				v := recover()
				if v == nil {
					return
				}
				pe := &PanicError{Value: v}
				if maxStack > 0 {
					st := debug.Stack()
					if len(st) > maxStack {
						st = st[:maxStack]
					}
					pe.Stack = st
				}
				// A Mark that returns nil must not turn a panic into a
				// success (the message would be acknowledged).
				if err = mark(pe); err == nil {
					err = pe
				}
			}()
			return next.Handle(ctx, msg)
		})
	}
}
